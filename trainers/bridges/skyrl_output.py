"""Closed harnessrl episodes -> one SkyRL `GeneratorOutput` (skyrl 0.3.0,
`skyrl.train.generators.base`). Pure: records in, SkyRL's dict out; no engine, no Docker.

Rows come in input order and all rows of one episode are adjacent (SkyRL's step-wise check).
- Not step-wise (`generator.step_wise_trajectories=false`): one row per episode, the segment
  `segment_policy` picks (`bridges.segments.select`: "longest" = most sampled tokens, "last" =
  the conversation the harness ended in). A harness that rewrote its history has several
  segments; the sampled tokens of those left out are counted in `harnessrl/dropped_tokens`.
- Step-wise: `step_rows="segment"` (default) gives one row per segment, which is what SkyRL's
  `merge_stepwise_output` would make of per-call rows; `step_rows="call"` gives one row per
  delivered model call (the shape of SkyRL's Harbor integration; merge them back with
  `generator.merge_stepwise_output=true`). The episode's last row has `is_last_step` true.
- A row: `prompt_token_ids` the exact ids its first call sent; `response_ids` every token after
  them (completions, and the tokens the harness added between calls); `loss_masks` 1 exactly on
  sampled tokens; `rollout_logprobs` the engine's, 0.0 elsewhere; `rewards` one float per row:
  the hidden-test reward on the episode's last row, 0.0 on earlier steps (SkyRL's trainer puts a
  float reward on the row's last token); `stop_reasons` the engine finish of the row's last call
  ("stop" | "length"). With `max_seq_len`, a response is cut so prompt + response fit; cut
  sampled tokens are counted as dropped.
- A masked episode (status infra_error: sandbox died, engine failed, cancelled, stale) is one
  placeholder row, SkyRL's Harbor convention for a failed trial: prompt [0], response [0], mask
  [0], logprob [0.0], reward 0.0, stop "error". With `mask_failed_groups` (default, as Harbor)
  every rollout of the same prompt (`instance_id`) becomes such a row, since a GRPO group would
  otherwise take its baseline over the survivors only. An episode with no sampled token at all
  (its harness made no model call) is one such row too, with its real reward and stop "stop".
- `overlong_filtering` (SkyRL's `generator.apply_overlong_filtering`) zeroes the mask of rows
  whose stop is not "stop"; `zero_reward_on_non_stop` (SkyRL's knob of that name) their reward.
- `rollout_metrics`: SkyRL's `get_rollout_metrics` over the trained episodes, plus `harnessrl/*`:
  episodes, masked episodes and their fraction, masked rows, dropped and detached sampled tokens,
  history rewrites, env latency p50/p95/p99 (s), model-call latency p50/p95 (s), success rate,
  and the count of each ending.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from harnessrl.gym.rollout import report
from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.bridges.segments import SegmentRow, segment_rows, select, truncate

StepRows = Literal["segment", "call"]
_PLACEHOLDER = dict(prompt=[0], response=[0], mask=[0], logprobs=[0.0])


@dataclass
class Episode:
    """One finished episode as the generator saw it."""

    trajectory_id: Any
    """SkyRL's `TrajectoryID` (instance_id, repetition_id), passed through untouched."""
    trajectory: Trajectory
    seconds: float
    """Wall-clock time of the whole episode (sandbox, harness, grading)."""


@dataclass
class _Row:
    prompt: list[int]
    response: list[int]
    mask: list[int]
    logprobs: list[float]
    stop: str
    reward: float = 0.0


def _finish(traj: Trajectory, segment: int | None = None) -> str:
    calls = [c for c in traj.delivered_calls if segment is None or c.segment == segment]
    return "length" if calls and calls[-1].finish_reason == "length" else "stop"


def _call_rows(traj: Trajectory) -> list[SegmentRow]:
    """One row per delivered call with a completion: its exact prompt, its sampled tokens."""
    out = []
    for c in traj.delivered_calls:
        if c.completion_ids:
            n = len(c.completion_ids)
            out.append(SegmentRow(segment=c.segment, prompt_ids=traj.call_prompt(c),
                                  response_ids=list(c.completion_ids), response_mask=[1] * n,
                                  response_logprobs=[float(x) for x in c.logprobs], versions=list(c.versions),
                                  num_calls=1))
    return out


def episode_rows(traj: Trajectory, *, step_wise: bool, step_rows: StepRows = "segment",
                 segment_policy: str = "longest", max_seq_len: int | None = None) -> tuple[list[_Row], int]:
    """(rows of one trainable episode, sampled tokens left out of them); no rows: nothing sampled."""
    if step_rows not in ("segment", "call"):
        raise ValueError(f"step_rows: {step_rows!r} is not one of segment, call")
    if step_wise and step_rows == "call":
        rows, dropped = _call_rows(traj), 0
        stops = [("length" if c.finish_reason == "length" else "stop") for c in traj.delivered_calls if c.completion_ids]
    else:
        rows, dropped = select(segment_rows(traj), "all" if step_wise else segment_policy, traj)
        stops = [_finish(traj, r.segment) for r in rows]
    out = []
    for r, stop in zip(rows, stops):
        if max_seq_len is not None:
            room = max_seq_len - len(r.prompt_ids)
            if room <= 0:
                dropped += r.sampled_tokens
                continue
            r, _, cut = truncate(r, room)
            dropped += cut
            if cut:
                stop = "length"
        if r.sampled_tokens:
            out.append(_Row(r.prompt_ids, r.response_ids, r.response_mask, r.response_logprobs, stop))
    if out:
        out[-1].reward = float(traj.reward or 0.0)
    return out, dropped


def build_output(episodes: list[Episode], *, step_wise: bool, step_rows: StepRows = "segment",
                 segment_policy: str = "longest", max_seq_len: int | None = None,
                 mask_failed_groups: bool = True, overlong_filtering: bool = False,
                 zero_reward_on_non_stop: bool = False) -> dict[str, Any]:
    """The `GeneratorOutput` of a batch of episodes (see the module doc)."""
    failed = {e.trajectory_id.instance_id for e in episodes if not e.trajectory.trainable}
    rows: list[_Row] = []
    owner: list[Episode] = []
    last: list[bool] = []
    masked_eps, dropped, trained = 0, 0, []
    for e in episodes:
        t = e.trajectory
        masked = not t.trainable or (mask_failed_groups and e.trajectory_id.instance_id in failed)
        mine, lost = ([], 0) if masked else episode_rows(t, step_wise=step_wise, step_rows=step_rows,
                                                         segment_policy=segment_policy, max_seq_len=max_seq_len)
        if masked:
            masked_eps += 1
            mine = [_Row(**_PLACEHOLDER, stop="error")]
        elif not mine:  # scored, but nothing was sampled: its reward stays, nothing trains
            mine = [_Row(**_PLACEHOLDER, stop="stop", reward=float(t.reward or 0.0))]
        else:
            trained.append(e)
        dropped += lost
        rows += mine
        owner += [e] * len(mine)
        last += [False] * (len(mine) - 1) + [True]
    masks = [list(r.mask) for r in rows]
    if zero_reward_on_non_stop:
        for r in rows:
            r.reward = r.reward if r.stop == "stop" else 0.0
    if overlong_filtering:
        masks = [[0] * len(m) if r.stop != "stop" else m for m, r in zip(masks, rows)]
    out: dict[str, Any] = {
        "prompt_token_ids": [r.prompt for r in rows],
        "response_ids": [r.response for r in rows],
        "rewards": [r.reward for r in rows],
        "loss_masks": masks,
        "stop_reasons": [r.stop for r in rows],
        "rollout_logprobs": [r.logprobs for r in rows],
        "trajectory_ids": [e.trajectory_id for e in owner],
        "trajectory_generation_times": [e.seconds for e in owner],
        "rollout_expert_indices": None,
        "is_last_step": last if step_wise else None,
        "env_metrics": [_env_metrics(e.trajectory) for e in owner],
        "rollout_metrics": metrics(episodes, trained, rows, masks, masked_eps, dropped),
    }
    return out


def _env_metrics(t: Trajectory) -> dict[str, Any]:
    return {"task_id": t.task_id, "session_id": t.session_id, "status": t.status, "termination": t.termination,
            "reward": t.reward, "segments": len(t.segments), "calls": len(t.calls)}


def metrics(episodes: list[Episode], trained: list[Episode], rows: list[_Row], masks: list[list[int]],
            masked_eps: int, dropped: int) -> dict[str, Any]:
    """SkyRL's rollout metrics over the trained rows, and harnessrl's own (module doc)."""
    from skyrl.train.generators.utils import get_rollout_metrics

    live = [(r, m) for r, m in zip(rows, masks) if any(m)]
    out: dict[str, Any] = {}
    if live:
        out.update(get_rollout_metrics([r.response for r, _ in live], [r.reward for r, _ in live],
                                       loss_masks=[m for _, m in live],
                                       trajectory_completion_times=[e.seconds for e in trained] or None))
    trajs = [e.trajectory for e in episodes]
    rep = report(trajs)
    n = len(episodes)
    out.update({
        "harnessrl/episodes": n,
        "harnessrl/masked_episodes": masked_eps,
        "harnessrl/masked_fraction": masked_eps / n if n else 0.0,
        "harnessrl/infra_errors": sum(1 for t in trajs if not t.trainable),
        "harnessrl/masked_rows": sum(1 for m in masks if not any(m)),
        "harnessrl/dropped_tokens": dropped,
        "harnessrl/detached_tokens": sum(len(c.completion_ids) for t in trajs for c in t.calls if c.detached),
        "harnessrl/history_rewrites": sum(max(0, len(t.segments) - 1) for t in trajs),
        "harnessrl/success_rate": rep["success_rate"] if rep["success_rate"] is not None else 0.0,
        "harnessrl/calls_per_episode": rep["calls_per_episode"] or 0.0,
    })
    for name, key in (("env_latency_s", "harnessrl/env_latency_s"), ("model_call_latency_s", "harnessrl/call_latency_s")):
        for q in ("p50", "p95", "p99"):
            if rep[name].get(q) is not None:
                out[f"{key}_{q}"] = rep[name][q]
    for ending, count in rep["endings"].items():
        out[f"harnessrl/endings/{ending or 'unknown'}"] = count
    return out
