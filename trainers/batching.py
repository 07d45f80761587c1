"""Samples -> padded micro-batches, and the logprobs of their sampled tokens under a model.

Micro-batches are planned by a token budget: samples sorted longest first are packed while
rows x longest-row stays within the budget (a sample longer than the budget rides alone).
Rows are right-padded, so real tokens keep positions 0..n-1 exactly as the engine saw them.

Only positions whose next token was sampled get logits (`logits_to_keep` with the union of
those positions over the micro-batch): the vocabulary projection is most of the memory of
a small model's forward pass, and prompt/tool positions need none. Everything per token is
therefore kept in a compact [rows, K] layout over those K positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harnessrl.trainers.samples import Sample


@dataclass
class MicroBatch:
    input_ids: Tensor
    """[B, T] right-padded token ids."""
    attention_mask: Tensor
    """[B, T] 1 on real tokens."""
    keep: Tensor
    """[K] positions whose logits are computed (position p predicts token p + 1)."""
    targets: Tensor
    """[B, K] the token at keep + 1 in each row."""
    mask: Tensor
    """[B, K] float, 1 where that token was sampled by the policy (the loss mask)."""
    behav_logprobs: Tensor
    """[B, K] the engine's logprob of each sampled token."""
    versions: Tensor
    """[B, K] long, the policy version that sampled each token (-1 elsewhere)."""
    advantages: Tensor
    """[B, K] the row's advantage on every position."""
    seq_weight: Tensor
    """[B] each row's share of its trajectory's weight."""
    prox_logprobs: Tensor | None = None
    """[B, K] the trainer's logprobs before this step's first update (when recomputed)."""
    ref_logprobs: Tensor | None = None
    """[B, K] the reference model's logprobs (when a KL term is on)."""

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())


def plan_micro_batches(samples: list[Sample], token_budget: int) -> list[list[int]]:
    """Indices of `samples` grouped so rows x longest row <= token_budget (see module doc)."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].token_ids), i))
    plans: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = len(samples[i].token_ids)
        if current and max(longest, n) * (len(current) + 1) > token_budget:
            plans.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        plans.append(current)
    return plans


def collate(samples: list[Sample], pad_id: int, device: torch.device) -> MicroBatch:
    """Right-pad `samples` into one MicroBatch on `device`."""
    rows, width = len(samples), max(len(s.token_ids) for s in samples)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attn = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.float32)
    behav = torch.zeros((rows, width), dtype=torch.float32)
    versions = torch.full((rows, width), -1, dtype=torch.long)
    for r, s in enumerate(samples):
        n = len(s.token_ids)
        ids[r, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[r, :n] = 1
        mask[r, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        behav[r, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        versions[r, :n] = torch.tensor(s.versions, dtype=torch.long)
    # Position p's logits predict token p + 1: keep every p whose next token was sampled
    # in some row (validation guarantees position 0 is never sampled).
    next_sampled = mask[:, 1:].amax(dim=0) > 0
    keep = torch.nonzero(next_sampled).squeeze(-1)
    cols = keep + 1
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        keep=keep.to(device),
        targets=ids[:, cols].to(device),
        mask=mask[:, cols].to(device),
        behav_logprobs=behav[:, cols].to(device),
        versions=versions[:, cols].to(device),
        advantages=adv[:, None].expand(rows, len(cols)).contiguous().to(device),
        seq_weight=torch.tensor([s.weight for s in samples], dtype=torch.float32, device=device),
    )


def token_logprobs(model, mb: MicroBatch, temperature: float = 1.0) -> Tensor:
    """[B, K] float32 log_softmax(logits / temperature) of each target token.

    The temperature is the sampling temperature: the engine's logprobs are those of the
    distribution it sampled from, so the trainer must score the same distribution.
    """
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        logits_to_keep=mb.keep,
        use_cache=False,
    )
    logits = out.logits.float()
    if logits.shape[1] != mb.keep.shape[0]:  # a model that ignores logits_to_keep
        logits = logits[:, mb.keep]
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
