"""A trajectory's segments as (prompt, response, mask, logprobs) rows for trainers that take
one linear sequence per sample (verl's `AgentLoopOutput`, SkyRL's `GeneratorOutput`).

Contract:
- `segment_rows(traj)` gives one `SegmentRow` per segment, in segment order. Its
  `prompt_ids` are the exact ids the segment's first call sent to the engine (checked
  against the segment's own tokens); `response_ids` are every token after them in the
  segment: each call's sampled completion and the tokens the harness/env added between
  calls. `response_mask` is the record's loss mask (1 exactly on sampled tokens),
  `response_logprobs` the engine's logprobs (0.0 where the mask is 0), `versions` the
  policy version of each response token (-1 where the mask is 0). Nothing is re-tokenized.
- `select(rows, policy)` applies a segment policy and says how many sampled tokens it left
  out (`dropped_tokens`), so a bridge can report them instead of losing them silently:
  "longest": the row with the most sampled tokens (ties: the later segment);
  "last": the row of the segment the episode's last delivered call extended (the
  conversation the harness ended in; the last segment when no call says);
  "all": every row that has a sampled token (drops nothing).
  Rows without any sampled token are never selected (there is nothing to train there).
- `truncate(row, max_response)` cuts a row's response to at most `max_response` tokens
  and returns the counts cut (all tokens, sampled tokens).

Pure functions over `gym.trajectory` records: no trainer framework is imported here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from harnessrl.gym.trajectory import Trajectory

SegmentPolicy = Literal["longest", "last", "all"]
SEGMENT_POLICIES: tuple[str, ...] = ("longest", "last", "all")


@dataclass(frozen=True)
class SegmentRow:
    """One segment as one trainer sequence: prompt, then the response the mask covers."""

    segment: int
    """Index of the segment in `Trajectory.segments`."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    versions: list[int]
    num_calls: int
    """Delivered calls whose completion lies in this segment."""
    split_reason: str | None = None

    @property
    def sampled_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def min_version(self) -> int | None:
        """Oldest policy version among the sampled tokens (None: nothing sampled)."""
        vs = [v for v, m in zip(self.versions, self.response_mask) if m]
        return min(vs) if vs else None

    @property
    def max_version(self) -> int | None:
        vs = [v for v, m in zip(self.versions, self.response_mask) if m]
        return max(vs) if vs else None


def _prompt_len(traj: Trajectory, s: int) -> int:
    """How many leading tokens of segment `s` are its first call's prompt."""
    seg = traj.segments[s]
    first = next((c for c in traj.delivered_calls if c.segment == s), None)
    if first is None:  # a hand-built record without calls: the prompt ends at the first sampled token
        return next((i for i, m in enumerate(seg.loss_mask) if m), len(seg.token_ids))
    prompt = traj.call_prompt(first)
    if seg.token_ids[:len(prompt)] != prompt:
        raise ValueError(f"trajectory {traj.session_id} segment {s}: does not start with the prompt of its "
                         f"first call {first.call_id} ({len(prompt)} tokens)")
    return len(prompt)


def segment_rows(traj: Trajectory) -> list[SegmentRow]:
    """Every segment of `traj` as a `SegmentRow` (see the module doc)."""
    traj.validate()
    rows = []
    for s, seg in enumerate(traj.segments):
        p = _prompt_len(traj, s)
        if any(seg.loss_mask[:p]):
            raise ValueError(f"trajectory {traj.session_id} segment {s}: a sampled token lies inside the prompt "
                             f"of its first call")
        rows.append(SegmentRow(
            segment=s, prompt_ids=list(seg.token_ids[:p]), response_ids=list(seg.token_ids[p:]),
            response_mask=list(seg.loss_mask[p:]),
            response_logprobs=[float(lp) if m else 0.0 for lp, m in zip(seg.logprobs[p:], seg.loss_mask[p:])],
            versions=[int(v) if m else -1 for v, m in zip(seg.versions[p:], seg.loss_mask[p:])],
            num_calls=sum(1 for c in traj.delivered_calls if c.segment == s), split_reason=seg.split_reason))
    return rows


def select(rows: list[SegmentRow], policy: str, traj: Trajectory | None = None) -> tuple[list[SegmentRow], int]:
    """(rows kept, sampled tokens left out) under `policy` ("longest" | "last" | "all").
    `traj` tells "last" which segment the final delivered call extended."""
    if policy not in SEGMENT_POLICIES:
        raise ValueError(f"segment_policy: {policy!r} is not one of {', '.join(SEGMENT_POLICIES)}")
    live = [r for r in rows if r.sampled_tokens > 0]
    if not live:
        return [], 0
    if policy == "all":
        kept = live
    elif policy == "longest":
        kept = [max(reversed(live), key=lambda r: r.sampled_tokens)]  # reversed: a tie goes to the later one
    else:
        calls = traj.delivered_calls if traj is not None else []
        final = next((c.segment for c in reversed(calls) if c.completion_ids), None)
        kept = [next((r for r in live if r.segment == final), live[-1])]
    dropped = sum(r.sampled_tokens for r in live) - sum(r.sampled_tokens for r in kept)
    return kept, dropped


def truncate(row: SegmentRow, max_response: int) -> tuple[SegmentRow, int, int]:
    """(row with at most `max_response` response tokens, tokens cut, sampled tokens cut)."""
    if max_response < 0:
        raise ValueError(f"max_response: {max_response} must be >= 0")
    cut = len(row.response_ids) - max_response
    if cut <= 0:
        return row, 0, 0
    n = max_response
    short = replace(row, response_ids=row.response_ids[:n], response_mask=row.response_mask[:n],
                    response_logprobs=row.response_logprobs[:n], versions=row.versions[:n])
    return short, cut, sum(row.response_mask[n:])
