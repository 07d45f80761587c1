"""LoRA for the built-in trainer: peft adapters on the decoder's linear layers.

Contract: `wrap(model, config)` returns the peft model whose only trainable parameters are the
adapter's A and B matrices (B starts at zero, so version 0 of a LoRA run is exactly the base
model); `save_adapter` writes peft's own folder (`adapter_config.json` +
`adapter_model.safetensors`, megabytes) that the local engine's `/load_lora_adapter`, SGLang's
`/load_lora_adapter` and vLLM's `/v1/load_lora_adapter` all read; `merged_state_dict` is the
same policy as full weights (W + (alpha / r) * B @ A per adapted layer, computed by peft's own
`get_delta_weight`, the base weights untouched) for engines that take only whole models.
The adapter math is peft's; nothing here re-implements a LoRA layer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

ADAPTER = "default"
"""peft's name of the one adapter the trainer trains."""


class LoraConfig(BaseModel):
    """Low-rank adapters instead of full fine-tuning (`TorchTrainerConfig.lora`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    rank: int = Field(16, ge=1)
    """r: the inner dimension of each adapter (B is out x r, A is r x in); the adapter's size
    and capacity grow linearly with it."""
    alpha: float = Field(32.0, gt=0)
    """lora_alpha: the update is scaled by alpha / rank (alpha / sqrt(rank) with `rslora`), so
    changing the rank at a fixed alpha keeps the update's scale comparable."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training steps (0: none). Logprobs for the loss are
    taken in train mode, so a non-zero dropout makes the trainer's logprobs noisy against the
    engine's; keep 0 for RL unless you know you want it."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1)
    """Names of the decoder blocks' linear layers that get an adapter (the last part of the
    module name, e.g. "q_proj"); a name the model does not have is refused with the valid ones.
    The default adapts every linear layer of a Llama/SmolLM2 block (attention and MLP)."""
    rslora: bool = False
    """Rank-stabilized LoRA: scale by alpha / sqrt(rank) instead of alpha / rank."""
    sync: Literal["adapter", "merged"] = "adapter"
    """What a weight sync sends the engine: "adapter" (peft's adapter folder, megabytes, loaded
    by `/load_lora_adapter` and named in every generation as `lora_path`; the local engine, and
    SGLang started with `--enable-lora --max-lora-rank R --lora-target-modules ...`; an engine
    without the route (404) gets merged weights from then on) or "merged" (base + adapter as
    full weights through `/update_weights_from_disk`: any SGLang)."""


def target_names(model) -> list[str]:
    """The linear layers inside the model's decoder blocks, by their last name (what
    `target_modules` may name). The LM head is left out: in SmolLM2 it is tied to the embeddings."""
    inner = getattr(model, "model", None)
    blocks = getattr(inner, "layers", None)
    if blocks is None:
        raise ValueError(f"lora: {type(model).__name__} has no model.layers (decoder blocks) to adapt")
    return sorted({name.rsplit(".", 1)[-1] for b in blocks for name, mod in b.named_modules()
                   if isinstance(mod, torch.nn.Linear)})


def wrap(model, config: LoraConfig, seed: int = 0):
    """`model` with `config`'s adapters (peft), only they trainable; A is initialized from `seed`."""
    import peft

    valid = target_names(model)
    unknown = [t for t in config.target_modules if t not in valid]
    if unknown:
        raise ValueError(f"lora.target_modules: {', '.join(map(repr, unknown))} not in the model; "
                         f"valid: {', '.join(valid)}")
    pc = peft.LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                         target_modules=list(config.target_modules), use_rslora=config.rslora, bias="none",
                         task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, pc, adapter_name=ADAPTER)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors (peft's names, as in `adapter_model.safetensors`)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Put `adapter_state`'s tensors back (every one must land)."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(f"lora: checkpoint tensors the adapter does not have: {', '.join(unexpected[:5])}")


def save_adapter(model, folder: Path) -> None:
    """peft's adapter folder: adapter_config.json + adapter_model.safetensors."""
    model.save_pretrained(str(folder), safe_serialization=True, selected_adapters=[ADAPTER])
    (Path(folder) / "README.md").unlink(missing_ok=True)  # peft's model card stub, not the adapter
    nested = Path(folder) / ADAPTER  # peft nests non-default adapter names; ours is the default
    if nested.is_dir():  # pragma: no cover - defensive across peft versions
        for f in nested.iterdir():
            f.rename(Path(folder) / f.name)
        nested.rmdir()


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter folded in (W + delta), under the base
    model's own names; the live model is not changed (no merge/unmerge round trip, which would
    leave rounding in the base weights)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {f"{name}.weight": mod.get_delta_weight(ADAPTER)
              for name, mod in base.named_modules() if isinstance(mod, LoraLayer) and ADAPTER in mod.lora_A}
    out: dict[str, torch.Tensor] = {}
    for key, t in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = t + deltas[key].to(t.dtype) if key in deltas else t
    return out


def save_merged(model, folder: Path) -> None:
    """A loadable Hugging Face folder of the merged weights (`merged_state_dict`)."""
    model.get_base_model().save_pretrained(str(folder), state_dict=merged_state_dict(model), safe_serialization=True)


def publish_adapter(model, out: Path, *, version: int, step: int) -> Path:
    """`save_adapter` into `out` atomically, stamped with `harnessrl_version.json` as `publish` does."""
    from harnessrl.trainers import checkpoint

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint.atomic_dir(out)
    save_adapter(model, tmp)
    (tmp / "harnessrl_version.json").write_text(f'{{"version": {version}, "step": {step}}}\n')
    return checkpoint.commit_dir(tmp, out)
