"""Live sessions as a data source of `harnessrl train` (`[live]`): sessions a user's own harness
recorded through `harnessrl serve` (`gym.live`), rewarded later by feedback.

Contract:
- Only sessions marked live, closed, with a reward from feedback (status "ok") at least
  `min_reward_age_s` old are taken; an unrewarded session is never trained. Each is taken at
  most once per run, oldest feedback first, `per_step` per step, `max_sessions` in all.
- Token ids mean something only under one tokenizer and chat template: a session recorded
  with another model name, tokenizer hash or chat template hash than the run's is refused,
  once, with a line naming what differs (`refused`); so is one sampled by a policy version
  newer than the trainer's when first seen (its versions come from another numbering).
- They are off-policy data with exact behaviour logprobs: they go through the same policy
  loss as the run's own episodes (decoupled PPO by default: the importance weight from the
  recorded behaviour logprobs to the proximal policy, capped or masked, and the rollout
  correction), never SFT, which would ignore the reward's sign and the behaviour policy.
- They have no GRPO group (one user, one prompt): the advantage is REINFORCE with a baseline,
  reward - b, where b is the mean reward of every eligible live session in the store
  (`baseline = "pool_mean"`) or 0 (`"none"`); `trainers.samples` computes it from the record's
  reward and the baseline this module stamps in `metadata["live"]`, and `weight` (the
  record's `metadata["weight"]`) scales it. The policy version of each session's tokens is in
  `metadata["live"]["policy_version"]`, so the step's `live_staleness` shows how old they are.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.trajectory import Trajectory


class LiveConfig(BaseModel):
    """Live sessions trained beside the sandboxed tasks (module doc)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    store: str
    """The live store folder `harnessrl serve --store` records into."""
    per_step: int = Field(4, ge=1)
    """Live sessions added to each step's batch (fewer when fewer are eligible)."""
    max_sessions: int | None = Field(None, ge=1)
    """Live sessions taken over the whole run (None: no limit)."""
    weight: float = Field(1.0, gt=0, le=1)
    """Multiplies each live session's advantage (its `metadata["weight"]`): their share of the update."""
    min_reward_age_s: float = Field(0.0, ge=0)
    """A session's feedback must be at least this old (seconds), so a reward given by mistake can be corrected."""
    baseline: Literal["pool_mean", "none"] = "pool_mean"
    """Advantage = reward - baseline: the mean reward of the eligible live sessions in the store
    ("pool_mean"), or 0 ("none": plain REINFORCE; with rewards in [0, 1] every session is reinforced)."""


class LiveSource:
    """Takes eligible live sessions from the store, step by step (module doc)."""

    def __init__(self, config: LiveConfig, model: str, tokenizer, log: Callable[[str], None] = print):
        from harnessrl.gym.proxy.identity import template_hash, tokenizer_hash

        self.config, self.model, self.log = config, model, log
        self.tokenizer_hash, self.template_hash = tokenizer_hash(tokenizer), template_hash(tokenizer)
        self.used: list[str] = []
        """Sessions taken so far, in order (each once per run)."""
        self.refused: dict[str, str] = {}
        """Sessions refused, and why (once each)."""
        self.versions: dict[str, int] = {}
        """The oldest policy version of each session checked and accepted."""

    def _store(self):
        from pathlib import Path

        from harnessrl.gym.live.privacy import DB_NAME
        from harnessrl.gym.proxy.store import Store

        path = Path(self.config.store).expanduser() / DB_NAME
        if not path.exists():
            raise FileNotFoundError(f"live.store: no live store at {path} (harnessrl serve --store ...)")
        return Store(str(path))

    def mismatch(self, row: dict[str, Any]) -> str | None:
        """Why a session's tokens would not mean the same to this run, or None."""
        got = (row["model"], row["meta"].get("tokenizer_hash"), row["chat_template_hash"])
        want = (self.model, self.tokenizer_hash, self.template_hash)
        for name, g, w in zip(("model", "tokenizer hash", "chat template hash"), got, want):
            if g != w:
                return f"recorded with {name} {g!r}, this run's is {w!r}: its token ids would not mean the same"
        return None

    def eligible(self, row: dict[str, Any], now: float) -> bool:
        fb = row["meta"].get("feedback")
        return (row["meta"].get("live") is True and row["closed"] is not None and row["reward"] is not None
                and row["status"] == "ok" and isinstance(fb, dict) and isinstance(fb.get("at"), (int, float))
                and now - fb["at"] >= self.config.min_reward_age_s)

    def take(self, current_version: int) -> list[Trajectory]:
        """This step's live trajectories, each stamped with its baseline, weight and policy version."""
        cfg = self.config
        budget = cfg.per_step if cfg.max_sessions is None else min(cfg.per_step, cfg.max_sessions - len(self.used))
        if budget <= 0:
            return []
        store, now = self._store(), time.time()
        try:
            pool = [r for r in store.summaries() if self.eligible(r, now) and r["session_id"] not in self.refused]
            for r in pool:  # each session checked once, before it counts in the baseline
                if r["session_id"] not in self.versions:
                    self._check(store, r, current_version)
            pool = [r for r in pool if r["session_id"] not in self.refused]
            baseline = sum(r["reward"] for r in pool) / len(pool) if pool and cfg.baseline == "pool_mean" else 0.0
            fresh = sorted((r for r in pool if r["session_id"] not in self.used), key=lambda r: r["meta"]["feedback"]["at"])
            out = []
            for r in fresh[:budget]:
                traj, oldest = store.trajectory(r["session_id"]), self.versions[r["session_id"]]
                traj.metadata = dict(traj.metadata, weight=cfg.weight, live={
                    "baseline": baseline, "policy_version": oldest, "staleness": current_version - oldest})
                out.append(traj)
                self.used.append(traj.session_id)
            return out
        finally:
            store.close()

    def _check(self, store, row: dict[str, Any], current_version: int) -> None:
        """Refuse a session of another model, tokenizer or template, or sampled by a newer policy
        version than the trainer's; else note its oldest sampled version."""
        sid = row["session_id"]
        why = self.mismatch(row)
        if why is not None:
            self._refuse(sid, why)
            return
        traj = store.trajectory(sid)
        versions = [v for s in traj.segments for v, m in zip(s.versions, s.loss_mask) if m]
        if not versions:
            self._refuse(sid, "has no sampled token")
        elif max(versions) > current_version:
            self._refuse(sid, f"was sampled by policy version {max(versions)}, newer than this run's "
                              f"{current_version} (another run's numbering)")
        else:
            self.versions[sid] = min(versions)

    def _refuse(self, sid: str, why: str) -> None:
        self.refused[sid] = why
        self.log(f"live session {sid} refused: {why}")


def step_metrics(live: list[Trajectory]) -> dict[str, Any]:
    """The step's live figures: which sessions trained, their reward, baseline and staleness."""
    if not live:
        return {}
    rewards = [float(t.reward) for t in live]
    return {"live_sessions": [t.session_id for t in live], "live_reward_mean": sum(rewards) / len(rewards),
            "live_baseline": live[0].metadata["live"]["baseline"],
            "live_staleness": [t.metadata["live"]["staleness"] for t in live]}
