"""Next-token choice and its logprob, for a batch of rows with per-row parameters.

The logprob reported for a sampled token is `log_softmax(logits / temperature)[token]`
(with raw logits when temperature == 0, which means greedy argmax). It is taken *before*
top-p / top-k filtering, i.e. without renormalizing over the kept tokens: this is the
policy's own distribution at that temperature, which is what an RL importance ratio
against a trainer's forward pass needs. SGLang's sampler reports the same by default
(temperature applied, top-p/top-k not; `SGLANG_RETURN_ORIGINAL_LOGPROB` changes that there). Top-k keeps the k highest logits; top-p keeps the smallest set of tokens
whose probability sums to at least p (the top token is always kept).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Sampling parameters of one row."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    generator: torch.Generator | None = None


def _filtered_probs(scaled: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Probabilities over the vocabulary after top-k and top-p filtering (renormalized)."""
    logits = scaled
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # drop a token when the mass before it already reaches top_p
        drop_sorted = (cumulative - sorted_probs) >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample(logits: torch.Tensor, rows: list[RowParams], default_gen: torch.Generator,
           top_logprobs_num: int = 0) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
    """Pick one token per row of `logits` [B, V]; return ids, their logprobs, and top-n lists."""
    logits = logits.float()
    temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], dtype=logits.dtype)
    logprobs = torch.log_softmax(logits / temps[:, None], dim=-1)
    greedy = logits.argmax(dim=-1)
    ids: list[int] = []
    for i, r in enumerate(rows):
        if r.temperature <= 0 or r.top_k == 1:
            ids.append(int(greedy[i]))
            continue
        probs = _filtered_probs(logits[i] / r.temperature, r.top_p, r.top_k)
        ids.append(int(torch.multinomial(probs, 1, generator=r.generator or default_gen)))
    chosen = logprobs[torch.arange(len(rows)), torch.tensor(ids)].tolist()
    tops: list[list[tuple[float, int]]] = []
    if top_logprobs_num > 0:
        values, indices = torch.topk(logprobs, top_logprobs_num, dim=-1)
        tops = [list(zip(v.tolist(), ix.tolist())) for v, ix in zip(values, indices)]
    return ids, chosen, tops
