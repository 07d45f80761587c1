"""Prefilling several new requests in one forward: their prompts packed into one sequence.

Why: on CPU a short prompt's prefill costs about what one decode step does (every weight
is read once per forward, whatever the number of tokens), so 16 requests that arrive
together cost 16 weight reads when prefilled one by one, and one when packed.

How: the prompts are concatenated into a batch-1 sequence with position ids restarting at
0 for each prompt and a block-diagonal causal mask (a token attends to the earlier tokens
of its own prompt only), so each prompt's keys, values and last logits are, in exact
arithmetic, those of prefilling it alone; in float32 they agree to rounding (tests:
identical greedy ids, logprobs within 1e-5). Each prompt's KV is then sliced out and
joins the batch as if it had been prefilled alone.

Only for cold prompts (no prefix-cache hit, no input logprobs asked for, not a resumed
request) that are short (`MAX_PROMPT` tokens each, `MAX_TOTAL` together): attention over
the packed sequence costs the square of its length, which for long prompts would outweigh
the weight reads saved.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

MAX_PROMPT = 512
"""Longest prompt (tokens) packed with others; longer ones are prefilled alone."""

MAX_TOTAL = 2048
"""Most tokens in one packed forward."""


def block_causal_mask(lengths: list[int], dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, T, T] additive mask: 0 where query i may attend key j (same prompt, j <= i),
    the dtype's min elsewhere."""
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    pos = torch.arange(seg.shape[0], device=device)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def packed_forward(model, prompts: list[list[int]]) -> tuple[torch.Tensor, list[DynamicCache]]:
    """One forward over `prompts` packed; returns the logits at each prompt's last position
    [n, vocab] and each prompt's KV as a batch-1 `DynamicCache` of its own positions."""
    lengths = [len(p) for p in prompts]
    dev = model.device
    ids = torch.tensor([[t for p in prompts for t in p]], device=dev)
    positions = torch.cat([torch.arange(n, device=dev) for n in lengths])[None]
    ends = torch.tensor(lengths, device=dev).cumsum(0)
    dtype = next(model.parameters()).dtype
    out = model(input_ids=ids, position_ids=positions, attention_mask=block_causal_mask(lengths, dtype, dev),
                past_key_values=DynamicCache(), use_cache=True, logits_to_keep=ends - 1)
    layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    caches, start = [], 0
    for n in lengths:
        # a copy per prompt: a view would pin the packed KV for as long as any row lives
        caches.append(DynamicCache(ddp_cache_data=[(k[:, :, start:start + n].clone(), v[:, :, start:start + n].clone())
                                                   for k, v in layers]))
        start += n
    return out.logits[0], caches
