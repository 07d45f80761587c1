"""Samples -> padded micro-batches, and the logprobs of their sampled tokens under a model.

Micro-batches are planned by a token budget: samples sorted longest first are packed while
rows x longest-row stays within the budget (a sample longer than the budget rides alone).
Rows are right-padded, so real tokens keep positions 0..n-1 exactly as the engine saw them.

Only positions whose next token was sampled get logits (`logits_to_keep` with the union of
those positions over the micro-batch): the vocabulary projection is most of the memory of
a small model's forward pass, and prompt/tool positions need none. Everything per token is
therefore kept in a compact [rows, K] layout over those K positions.

Each target token is scored in the distribution its recorded logprob belongs to: at its own
temperature, top_p and top_k (`Sample.temperature` / `top_p` / `top_k`, from the record,
see `trainers.behaviour`), through `engine.sampling.processed_logprobs`, the function the
engine samples with; a micro-batch without filters takes the plain log_softmax path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harnessrl.trainers.engine.sampling import processed_logprobs
from harnessrl.trainers.samples import Sample

#: Rows of [positions, vocab] scored at once on the filtered path (bounds its sort's memory).
FILTER_CHUNK = 256


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
    temperature: Tensor | None = None
    """[B, K] temperature each target is scored at (None: 1.0)."""
    top_p: Tensor | None = None
    """[B, K] top_p of each target's distribution (None: 1.0, no filter)."""
    top_k: Tensor | None = None
    """[B, K] long, top_k of each target's distribution (None: -1, no filter)."""

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
    temp = torch.ones((rows, width), dtype=torch.float32)
    top_p = torch.ones((rows, width), dtype=torch.float32)
    top_k = torch.full((rows, width), -1, dtype=torch.long)
    for r, s in enumerate(samples):
        n = len(s.token_ids)
        ids[r, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[r, :n] = 1
        mask[r, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        behav[r, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        versions[r, :n] = torch.tensor(s.versions, dtype=torch.long)
        if s.temperature:
            temp[r, :n] = torch.tensor(s.temperature, dtype=torch.float32)
            top_p[r, :n] = torch.tensor(s.top_p, dtype=torch.float32)
            top_k[r, :n] = torch.tensor(s.top_k, dtype=torch.long)
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
        temperature=temp[:, cols].to(device),
        top_p=top_p[:, cols].to(device),
        top_k=top_k[:, cols].to(device),
    )


def token_logprobs(model, mb: MicroBatch) -> Tensor:
    """[B, K] float32 logprob of each target token in its recorded distribution (module doc).

    The engine's logprobs are those of the distribution it reports (`flags["sampling"]`), so
    the trainer scores that same distribution: at the target's temperature and, where its
    record says the logprobs are of the filtered distribution, with the same top-p/top-k.
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
    b, k, v = logits.shape
    temp = mb.temperature if mb.temperature is not None else torch.ones((b, k), device=logits.device)
    filtered = mb.top_p is not None and bool(((mb.top_p < 1.0) | ((mb.top_k > 0) & (mb.top_k < v))).any())
    if not filtered:
        if bool((temp != 1.0).any()):
            logits = logits / temp[..., None]
        return torch.log_softmax(logits, dim=-1).gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    flat, targets = logits.reshape(b * k, v), mb.targets.reshape(-1)
    t, p, tk = temp.reshape(-1), mb.top_p.reshape(-1), mb.top_k.reshape(-1)
    parts = []
    for i in range(0, b * k, FILTER_CHUNK):
        j = slice(i, i + FILTER_CHUNK)
        # always_keep: the engine sampled this token, so it is in the support even where this
        # forward pass's rounding puts it a hair outside the top-p boundary (no -inf logprob).
        table = processed_logprobs(flat[j], t[j], p[j], tk[j], always_keep=targets[j])
        parts.append(table.gather(-1, targets[j, None]).squeeze(-1))
    return torch.cat(parts).reshape(b, k)
