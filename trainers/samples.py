"""From trajectory records to training samples: validation, advantages, weights.

Contract:
- Records are validated where they enter (`validate_trajectory`); a bad one raises
  `RecordError` naming the session, the segment and the field.
- One `Sample` per segment that has at least one sampled token; its loss mask is the
  record's `loss_mask` (1 exactly on tokens the policy sampled), never widened.
- Advantages are outcome-level and constant over a trajectory. GRPO: trajectories are
  grouped by `task_id` (the G rollouts of one task), the baseline is the group's mean
  reward, optionally divided by the group's population standard deviation (+ eps).
- Each trajectory carries a total weight of 1, split over its samples either in
  proportion to their sampled-token counts ("tokens": a split trajectory then weighs
  exactly what it would unsplit, its loss is the mean over all its sampled tokens) or
  equally ("equal"). The loss's "sequence" normalization uses these weights; its "token"
  normalization counts every sampled token once, where splitting cannot matter either.
- A trajectory's `metadata["weight"]` (the scheduler's `downweight` policy: a staleness
  weight in (0, 1]) multiplies its advantage. Both policy losses are positively homogeneous
  in the advantage (min(u·cA, clip(u)·cA) = c·min(u·A, clip(u)·A) for c > 0), so this scales
  exactly that trajectory's policy-gradient term and leaves the others' untouched; the KL
  term is not scaled. Its group baseline still uses its unweighted reward.
- Live records (`metadata["live"]`, `trainers.live`: a user's own sessions rewarded by
  feedback) have no group: advantage = reward - `metadata["live"]["baseline"]` (a number in
  [0, 1] the live source stamps; REINFORCE with a baseline), scaled by their weight like any
  record; they take no part in any GRPO group, nor in the reward mean and success rate.
- Teacher records (`is_teacher`: `harnessrl collect`) are refused with a `RecordError`: they
  are never on-policy; `trainers.sft` builds their samples. Held-out evaluation records
  (`metadata["eval"]`, `trainers.evaluate`) are refused too: they are never trained on.
- Canary records (`metadata["canary"]`, `gym.canary`: tasks whose hidden tests contradict
  their statement) are left out: no samples, no part in any baseline, the reward mean or the
  success rate, whatever their reward says; they are counted (`SampleBatch.canaries`).
- Infra failures (status "infra_error", or no reward) are masked: no samples and no part
  in any baseline, never scored as 0. Truncated episodes follow `SampleConfig.truncated`.
- Each sampled token carries the parameters its recorded logprob must be recomputed with
  (`Sample.temperature` / `top_p` / `top_k`, read per call from the record by
  `trainers.behaviour.token_sampling`); greedy or unrecorded calls are refused there.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.trajectory import STATUSES, Trajectory
from harnessrl.trainers.records import RecordError

#: Engine logprobs are <= 0; allow float noise above zero, nothing more.
LOGPROB_TOLERANCE = 1e-3


class SampleConfig(BaseModel):
    """How trajectories become training samples."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    baseline: Literal["group_mean", "none"] = "group_mean"
    """"group_mean": GRPO, advantage = reward - mean reward of the trajectories with the same
    task_id in the batch. "none": advantage = reward (REINFORCE without baseline)."""
    normalize_std: bool = True
    """GRPO's std normalization: divide the group-relative advantage by the group's population
    std (+ std_eps). Off gives Dr. GRPO's unnormalized advantage. Ignored when baseline is "none"."""
    std_eps: float = Field(1e-6, gt=0)
    """Added to the group std before dividing, so a group with equal rewards gets advantage 0."""
    segment_weighting: Literal["tokens", "equal"] = "tokens"
    """How a trajectory's total weight of 1 is divided among its segments: by sampled-token
    count ("tokens") or equally ("equal")."""
    truncated: Literal["drop", "keep", "zero_advantage"] = "keep"
    """Truncated episodes (timeout, call limit): "drop" them entirely; "keep" them with their
    reward (they join the group baseline); or keep their samples with advantage 0 and leave
    them out of the baseline ("zero_advantage": no policy-gradient signal, KL still applies)."""
    success_threshold: float = 1.0
    """A scored trajectory counts as a success when reward >= this (for the success rate)."""


@dataclass
class Sample:
    """One segment ready for the loss: tokens, mask, behaviour logprobs, advantage, weight."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    """Behaviour (engine) logprob of each sampled token; 0.0 elsewhere."""
    versions: list[int]
    advantage: float
    weight: float
    """This sample's share of its trajectory's total weight of 1."""
    session_id: str
    segment: int
    task_id: str
    temperature: list[float] = field(default_factory=list)
    """Per token: the temperature to recompute its logprob at (the recorded one; 1.0 off the
    sampled tokens). Empty means 1.0 everywhere, no filters."""
    top_p: list[float] = field(default_factory=list)
    """Per token: top_p of the distribution its logprob belongs to (1.0: none)."""
    top_k: list[int] = field(default_factory=list)
    """Per token: top_k of that distribution (-1: none)."""

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class SampleBatch:
    samples: list[Sample]
    advantages: dict[str, float] = field(default_factory=dict)
    """Advantage of each trajectory that entered the loss, by session_id."""
    trajectories: int = 0
    """Trajectories that entered the loss (had at least one sample)."""
    masked_infra: int = 0
    dropped_truncated: int = 0
    canaries: int = 0
    """Canary records left out of the batch (never rewarded: `gym.canary`)."""
    reward_mean: float | None = None
    success_rate: float | None = None
    groups: int = 0
    """GRPO groups (task_ids) in the baseline."""
    degenerate_groups: int = 0
    """Groups whose rewards were all equal (advantage 0 for every member)."""


def validate_trajectory(traj: Trajectory, *, current_version: int | None = None, vocab_size: int | None = None) -> None:
    """Check a record's shapes, masks, logprobs and versions; raise `RecordError` on the first fault.

    Teacher records (`is_teacher`) are refused. A sampled token (mask 1) needs a version in [0, current_version] and a finite logprob
    <= 0; an unsampled one has version -1. Position 0 cannot be sampled: nothing precedes it.
    """
    sid = traj.session_id
    refuse_teacher(traj)
    if traj.status not in STATUSES or traj.status == "running":
        raise RecordError(sid, f"{traj.status!r} is not a finished status (ok, truncated, infra_error)", field="status")
    if traj.reward is not None and (isinstance(traj.reward, bool) or not math.isfinite(float(traj.reward))):
        raise RecordError(sid, f"{traj.reward!r} is not a finite number", field="reward")
    for s, seg in enumerate(traj.segments):
        n = len(seg.token_ids)
        if n == 0:
            raise RecordError(sid, "segment has no tokens", s, "token_ids")
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(seg, name)) != n:
                raise RecordError(sid, f"length {len(getattr(seg, name))} != len(token_ids) {n}", s, name)
        for i, tok in enumerate(seg.token_ids):
            if not isinstance(tok, int) or tok < 0 or (vocab_size is not None and tok >= vocab_size):
                raise RecordError(sid, f"[{i}] = {tok!r} is not a token id in [0, {vocab_size or 'vocab'})", s, "token_ids")
        for i, (m, lp, v) in enumerate(zip(seg.loss_mask, seg.logprobs, seg.versions)):
            if m not in (0, 1) or isinstance(m, bool):
                raise RecordError(sid, f"[{i}] = {m!r}, must be 0 or 1", s, "loss_mask")
            if m == 0:
                if v != -1:
                    raise RecordError(sid, f"[{i}] = {v!r} on an unsampled token (loss_mask 0); expected -1", s, "versions")
                continue
            if i == 0:
                raise RecordError(sid, "[0] = 1: the first token has no context and cannot be sampled", s, "loss_mask")
            if not isinstance(v, int) or v < 0:
                raise RecordError(sid, f"[{i}] = {v!r} on a sampled token; needs a policy version >= 0", s, "versions")
            if current_version is not None and v > current_version:
                raise RecordError(sid, f"[{i}] = {v} is newer than the trainer's version {current_version}", s, "versions")
            if not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > LOGPROB_TOLERANCE:
                raise RecordError(sid, f"[{i}] = {lp!r} on a sampled token; needs a finite logprob <= 0", s, "logprobs")


def is_teacher(traj: Trajectory) -> bool:
    """A teacher record (`harnessrl collect`, `gym.proxy.teacher`): its trajectory metadata or
    any of its calls says `teacher`. Its tokens were sampled by no policy of this run."""
    return bool(traj.metadata.get("teacher")) or any(c.flags.get("teacher") for c in traj.calls)


def refuse_teacher(traj: Trajectory) -> None:
    """RL trainers (and bridges, through `validate_trajectory`) never take teacher records, nor
    held-out evaluation records."""
    if is_teacher(traj):
        raise RecordError(traj.session_id, "is teacher data (no behaviour logprobs, no policy version): RL "
                          "trains only on the policy's own samples; train on it with the sft stage "
                          "(`trainers.sft`)", field="metadata.teacher")
    if traj.metadata.get("eval"):
        raise RecordError(traj.session_id, f"is a held-out evaluation episode ({traj.metadata['eval']}, "
                          "`trainers.evaluate`): evaluation records are never trained on", field="metadata.eval")


def _staleness_weight(traj: Trajectory) -> float:
    w = traj.metadata.get("weight", 1.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0 < w <= 1:
        raise RecordError(traj.session_id, f"{w!r} is not a staleness weight in (0, 1]", field="metadata.weight")
    return float(w)


def _segment_weights(counts: list[int], mode: str) -> list[float]:
    live = [c for c in counts if c > 0]
    if mode == "tokens":
        total = sum(live)
        return [c / total if c > 0 else 0.0 for c in counts]
    return [1.0 / len(live) if c > 0 else 0.0 for c in counts]


def _advantages(rewards_by_group: dict[str, list[tuple[str, float]]], config: SampleConfig) -> tuple[dict[str, float], int]:
    out: dict[str, float] = {}
    degenerate = 0
    for members in rewards_by_group.values():
        rewards = [r for _, r in members]
        if config.baseline == "none":
            out.update({sid: r for sid, r in members})
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        degenerate += std == 0.0
        for sid, r in members:
            adv = r - mean
            out[sid] = adv / (std + config.std_eps) if config.normalize_std else adv
    return out, degenerate


def build_samples(
    batch: list[Trajectory],
    config: SampleConfig,
    *,
    current_version: int | None = None,
    vocab_size: int | None = None,
    temperature: float = 1.0,
) -> SampleBatch:
    """Validate `batch` and turn it into samples with advantages and weights (see module doc).

    `temperature` scores trajectories that hold no call records (hand-built segments);
    recorded calls are scored at their own sampling (`trainers.behaviour`)."""
    _refuse_teachers_and_repeats(batch)
    result = SampleBatch(samples=[])
    triage = _triage(batch, config, result, current_version, vocab_size)
    advantages, result.degenerate_groups = _advantages(triage.in_baseline, config)
    result.groups = len(triage.in_baseline) if config.baseline == "group_mean" else 0
    advantages.update({t.session_id: 0.0 for t in triage.zero_adv})
    advantages.update({t.session_id: float(t.reward) - live_baseline(t) for t in triage.live})
    for traj in triage.kept + triage.zero_adv + triage.live:
        _add_samples(result, traj, advantages[traj.session_id], config, temperature)
    scored = triage.scored
    if scored:
        result.reward_mean = sum(scored) / len(scored)
        result.success_rate = sum(r >= config.success_threshold for r in scored) / len(scored)
    return result


def _refuse_teachers_and_repeats(batch: list[Trajectory]) -> None:
    """The whole batch is checked for teacher and evaluation records, and for a session that
    appears twice, before any record is sorted."""
    seen: set[str] = set()
    for traj in batch:
        refuse_teacher(traj)
        if traj.session_id in seen:
            raise RecordError(traj.session_id, "appears twice in the batch", field="session_id")
        seen.add(traj.session_id)


@dataclass
class _Triage:
    """Where each record of a batch goes (`_triage`)."""

    scored: list[float] = field(default_factory=list)
    """Rewards of the scored records, for the reward mean and success rate."""
    in_baseline: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    """(session_id, reward) by task_id: the GRPO groups."""
    zero_adv: list[Trajectory] = field(default_factory=list)
    """Truncated records kept with advantage 0 (`truncated="zero_advantage"`)."""
    kept: list[Trajectory] = field(default_factory=list)
    """Records trained on with their group-relative advantage."""
    live: list[Trajectory] = field(default_factory=list)
    """Live records (`trainers.live`), trained on with reward minus their baseline."""


def _triage(batch: list[Trajectory], config: SampleConfig, result: SampleBatch, current_version: int | None,
            vocab_size: int | None) -> _Triage:
    """Each record left out (canary, infra, dropped truncated: counted in `result`), or
    validated and kept, in the baseline or with advantage 0."""
    out = _Triage()
    for traj in batch:
        if traj.metadata.get("canary"):  # never rewarded, never trained on (gym.canary)
            result.canaries += 1
            continue
        if traj.status not in STATUSES or traj.status == "running":
            validate_trajectory(traj)  # raises with the status named
        if masked(traj, config):
            result.masked_infra += 1
            continue
        if traj.status == "truncated" and config.truncated == "drop":
            result.dropped_truncated += 1  # never enters training, so not validated
            if traj.reward is not None:
                out.scored.append(float(traj.reward))
            continue
        validate_trajectory(traj, current_version=current_version, vocab_size=vocab_size)
        if traj.metadata.get("live") is not None:
            live_baseline(traj)  # a bad stamp is refused before anything trains
            out.live.append(traj)
            continue
        if traj.reward is not None:
            out.scored.append(float(traj.reward))
        if traj.status == "truncated" and config.truncated == "zero_advantage":
            out.zero_adv.append(traj)
            continue
        if config.baseline == "group_mean" and not traj.task_id:
            raise RecordError(traj.session_id, "is empty; GRPO groups rollouts by task_id", field="task_id")
        out.in_baseline[traj.task_id].append((traj.session_id, float(traj.reward)))
        out.kept.append(traj)
    return out


def _add_samples(result: SampleBatch, traj: Trajectory, advantage: float, config: SampleConfig,
                 temperature: float) -> None:
    """One trajectory's samples (one per segment with a sampled token), its advantage scaled
    by its staleness weight."""
    # behaviour reads the engine's logprob spaces (torch): imported only when samples are built
    from harnessrl.trainers.behaviour import token_sampling

    counts = [sum(seg.loss_mask) for seg in traj.segments]
    if sum(counts) == 0:
        return  # a rollout with no sampled token still counted in its group's baseline
    weights = _segment_weights(counts, config.segment_weighting)
    scoring = token_sampling(traj, temperature)
    adv = advantage * _staleness_weight(traj)
    result.advantages[traj.session_id] = adv
    result.trajectories += 1
    for s, (seg, w) in enumerate(zip(traj.segments, weights)):
        if counts[s] == 0:
            continue
        result.samples.append(
            Sample(
                token_ids=list(seg.token_ids),
                loss_mask=list(seg.loss_mask),
                logprobs=[float(x) for x in seg.logprobs],
                versions=list(seg.versions),
                advantage=adv,
                weight=w,
                session_id=traj.session_id,
                segment=s,
                task_id=traj.task_id,
                temperature=[x[0] for x in scoring[s]],
                top_p=[x[1] for x in scoring[s]],
                top_k=[x[2] for x in scoring[s]],
            )
        )


def live_baseline(traj: Trajectory) -> float:
    """The baseline a live record's advantage is measured from (`trainers.live`): a number in
    [0, 1], as rewards are; anything else is a `RecordError` naming the field."""
    live = traj.metadata.get("live")
    b = live.get("baseline") if isinstance(live, dict) else None
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not 0 <= b <= 1:
        raise RecordError(traj.session_id, f"{b!r} is not a live baseline in [0, 1]", field="metadata.live.baseline")
    if traj.reward is None or traj.status != "ok":
        raise RecordError(traj.session_id, "a live session trains only once feedback rewarded it", field="reward")
    return float(b)


def masked(traj: Trajectory, config: SampleConfig) -> bool:
    """Left out because the infrastructure failed: an infra_error, or no reward (save a truncated
    episode that `truncated = "zero_advantage"` keeps with advantage 0)."""
    return traj.status == "infra_error" or (
        traj.reward is None and not (traj.status == "truncated" and config.truncated == "zero_advantage"))


def baseline_members(group: list[Trajectory], config: SampleConfig) -> list[tuple[str, float]]:
    """(session id, reward) of the trajectories of `group` that enter GRPO's baseline under
    `config`, as `build_samples` decides it: no canary, no infrastructure failure, scored, and
    not a truncated episode that `truncated` keeps out of the baseline."""
    return [(t.session_id, float(t.reward)) for t in group
            if not t.metadata.get("canary") and t.status != "infra_error" and t.reward is not None
            and not (t.status == "truncated" and config.truncated != "keep")]
