"""Supervised fine-tuning on teacher trajectories: samples, and the masked cross-entropy.

Contract:
- `sft_samples` takes teacher records only (`samples.is_teacher`; RL records are refused
  here as teacher records are refused by `samples.build_samples`), finished and scored; by
  default only successful ones (reward >= `min_reward`: rejection sampling, which
  `harnessrl collect` already applies). A bad record raises `RecordError` naming the
  session, segment and field. One `Sample` per segment with at least one loss-mask token;
  its mask is the record's `loss_mask` (1 exactly on the assistant tokens the teacher
  wrote), never widened. Teacher tokens have no behaviour logprob and no policy version:
  the sample carries logprob 0.0 and version -1 everywhere, advantage 0, and its share of
  its trajectory's weight by token count.
- `sft_batches(records, batch_size, steps, seed)` is which records each SFT step takes: passes
  over the file, each pass a fresh permutation drawn from `random.Random(seed)` (the trainer's
  seed, so runs of different seeds see the teacher data in different orders and are
  independent), batches taken back to back across passes; `seed` None keeps file order.
- `sft_loss` is the token-mean negative log-likelihood of the masked tokens:
  L = -Σ m_t·log p(x_t) / D, with D the loss-mask token count of the whole update (pass
  it so micro-batches add up to the update's loss). No label smoothing, no KL, no weights.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

from torch import Tensor

from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.losses import aggregate
from harnessrl.trainers.samples import RecordError, Sample, is_teacher


def sft_loss(logp: Tensor, mask: Tensor, denominator: float | Tensor | None = None) -> Tensor:
    """-Σ m·logp / denominator (default Σ m): masked token-mean cross-entropy (module doc)."""
    return aggregate(-logp, mask, mode="token", denominator=denominator)


def sft_batches(records: int, batch_size: int, steps: int, seed: int | None) -> list[list[int]]:
    """Each step's record indices, sorted (module doc); `batch_size` 0: every record every step."""
    if records < 1:
        raise ValueError("sft.data: no record to train on")
    size = min(batch_size or records, records)
    rng = random.Random(seed)

    def stream():
        while True:
            order = list(range(records))
            if seed is not None:
                rng.shuffle(order)
            yield from order

    it = stream()
    out = []
    for _ in range(steps):
        picked: list[int] = []
        while len(picked) < size:  # a batch spanning two passes never holds a record twice
            i = next(it)
            if i not in picked:
                picked.append(i)
        out.append(sorted(picked))
    return out


def load_teacher_file(path: str | Path) -> list[Trajectory]:
    """Trajectories from a `harnessrl collect` trajectories.jsonl (one record a line)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sft.data: {p} is not a file (a trajectories.jsonl from `harnessrl collect`)")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_dict(json.loads(line)))
        except (ValueError, TypeError) as e:
            raise ValueError(f"sft.data: {p} line {i} is not a trajectory record: {e}") from None
    if not out:
        raise ValueError(f"sft.data: {p} holds no trajectory")
    return out


def _check_segment(traj: Trajectory, s: int, vocab_size: int | None) -> None:
    seg, sid = traj.segments[s], traj.session_id
    n = len(seg.token_ids)
    if n == 0:
        raise RecordError(sid, "segment has no tokens", s, "token_ids")
    if len(seg.loss_mask) != n:
        raise RecordError(sid, f"length {len(seg.loss_mask)} != len(token_ids) {n}", s, "loss_mask")
    for i, tok in enumerate(seg.token_ids):
        if not isinstance(tok, int) or tok < 0 or (vocab_size is not None and tok >= vocab_size):
            raise RecordError(sid, f"[{i}] = {tok!r} is not a token id in [0, {vocab_size or 'vocab'})", s, "token_ids")
    for i, m in enumerate(seg.loss_mask):
        if m not in (0, 1) or isinstance(m, bool):
            raise RecordError(sid, f"[{i}] = {m!r}, must be 0 or 1", s, "loss_mask")
    if seg.loss_mask[0]:
        raise RecordError(sid, "[0] = 1: the first token has no context to be predicted from", s, "loss_mask")


def sft_samples(batch: list[Trajectory], *, vocab_size: int | None = None, min_reward: float | None = 1.0) -> list[Sample]:
    """Validated teacher records -> SFT samples (module doc). `min_reward` None keeps every
    scored record whatever its reward."""
    out: list[Sample] = []
    for traj in batch:
        sid = traj.session_id
        if not is_teacher(traj):
            raise RecordError(sid, "is not teacher data (no `teacher` in its metadata or call flags): SFT trains "
                              "on `harnessrl collect` records; the policy's own rollouts go to the rl stage",
                              field="metadata.teacher")
        if traj.status not in ("ok", "truncated"):
            raise RecordError(sid, f"{traj.status!r}: only finished, scored episodes are trained on", field="status")
        if traj.reward is None or not math.isfinite(float(traj.reward)):
            raise RecordError(sid, f"{traj.reward!r} is not a score", field="reward")
        if min_reward is not None and traj.reward < min_reward:
            raise RecordError(sid, f"{traj.reward} < {min_reward}: a failed teacher episode (collect keeps only "
                              "successful ones unless --keep all)", field="reward")
        counts = [sum(seg.loss_mask) for seg in traj.segments]
        total = sum(counts)
        for s, seg in enumerate(traj.segments):
            _check_segment(traj, s, vocab_size)
            if counts[s] == 0:
                continue
            n = len(seg.token_ids)
            out.append(Sample(token_ids=list(seg.token_ids), loss_mask=list(seg.loss_mask), logprobs=[0.0] * n,
                              versions=[-1] * n, advantage=0.0, weight=counts[s] / total, session_id=sid,
                              segment=s, task_id=traj.task_id))
    return out
