"""The local engine's attention on CPU: SDPA over the grouped KV heads as they are cached.

HF's "sdpa" path repeats every key/value head `num_attention_heads / num_key_value_heads`
times (a copy of the whole cache per layer per step) whenever an attention mask is given,
which the engine does on every step of a padded batch. torch's CPU SDPA takes the grouped
heads directly (`enable_gqa=True`, torch >= 2.5) with a mask too, and gives bit-identical
results; on CUDA the grouped path with a mask falls back to the math kernel, so there the
model keeps HF's "sdpa". Everything else (the causal flag, scaling, the output layout) is
what HF's sdpa attention does; masks are built by HF's sdpa mask function.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "harnessrl_gqa_sdpa"


def gqa_sdpa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def use_gqa_sdpa(model) -> bool:
    """Switch a CPU model that uses HF's "sdpa" to `gqa_sdpa_forward`; True if switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if model.device.type != "cpu" or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, gqa_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
