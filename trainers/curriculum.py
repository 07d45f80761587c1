"""A difficulty curriculum: which task the scheduler starts next, by each task's pass rate so far.

GRPO learns from a task only while the policy sometimes solves it (dynamic_sampling drops the
groups that are all wrong or all right), so the tasks worth rollouts move as the policy learns.
`Curriculum` is the scheduler's task iterator: every draw picks a task at random with weight

    w(task) = max(floor, 4 * p * (1 - p)),   p = (successes + 1) / (attempts + 2)

p is the pass rate under a uniform prior, so an untried task has p = 1/2 and the highest
weight (1), a task solved half the time stays there, and one never or always solved falls
towards `floor` (never to 0: a task the policy cannot solve today is retried now and then,
and a solved one is checked for forgetting). `mode = "uniform"` cycles the tasks in order
instead (today's behaviour) but still tracks the rates for the report.

Attempts are the trained-on kind only: a canary, an infrastructure failure or an unscored
episode says nothing about the policy. Draws run ahead of results (the scheduler starts
groups while earlier ones run), so weights lag by up to the staleness window. The draw is
seeded: the same seed and the same results give the same tasks.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.trajectory import Trajectory


class CurriculumConfig(BaseModel):
    """How RL picks its next task (module doc)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mode: Literal["pass_rate", "uniform"] = "pass_rate"
    """`pass_rate`: favour tasks the policy sometimes solves; `uniform`: cycle the tasks in order."""
    floor: float = Field(0.1, gt=0.0, le=1.0)
    """The least weight a task keeps, relative to an untried task's 1."""
    success_threshold: float = 1.0
    """A reward at or above this is a success."""
    seed: int = 0
    """Seed of the weighted draw."""


@dataclass
class TaskRecord:
    """One task's history in this run."""

    attempts: int = 0
    successes: int = 0
    draws: int = 0

    @property
    def pass_rate(self) -> float | None:
        return self.successes / self.attempts if self.attempts else None

    @property
    def estimate(self) -> float:
        """The pass rate under a uniform prior: (successes + 1) / (attempts + 2)."""
        return (self.successes + 1) / (self.attempts + 2)


class Curriculum:
    """The scheduler's task iterator; `observe` feeds it each batch's results (module doc)."""

    def __init__(self, task_ids: Iterable[str], config: CurriculumConfig | None = None):
        self.config = config or CurriculumConfig()
        self.ids = sorted(set(task_ids))
        if not self.ids:
            raise ValueError("a curriculum needs at least one task")
        self.records = {t: TaskRecord() for t in self.ids}
        self._rng = random.Random(self.config.seed)
        self._next = 0  # uniform mode's place in the cycle

    def weight(self, task_id: str) -> float:
        p = self.records[task_id].estimate
        return max(self.config.floor, 4.0 * p * (1.0 - p))

    def __iter__(self) -> "Curriculum":
        return self

    def __next__(self) -> str:
        task = self._draw(self._rng)
        self.records[task].draws += 1
        return task

    def _draw(self, rng: random.Random) -> str:
        if self.config.mode == "uniform":
            self._next += 1
            return self.ids[(self._next - 1) % len(self.ids)]
        return rng.choices(self.ids, weights=[self.weight(t) for t in self.ids])[0]

    def peek(self, n: int) -> list[str]:
        """The next `n` draws if nothing is observed meanwhile, without drawing them (the warm
        pool starts their sandboxes before the scheduler asks)."""
        rng, at = random.Random(), self._next
        rng.setstate(self._rng.getstate())
        try:
            return [self._draw(rng) for _ in range(n)]
        finally:
            self._next = at

    def observe(self, batch: Iterable[Trajectory]) -> None:
        """Count each scored, non-canary episode of a task this curriculum draws from."""
        for traj in batch:
            rec = self.records.get(traj.task_id)
            if (rec is None or traj.metadata.get("canary") or traj.status == "infra_error"
                    or traj.reward is None):
                continue
            rec.attempts += 1
            rec.successes += float(traj.reward) >= self.config.success_threshold

    def report(self) -> dict:
        """The run report's "curriculum" section: per task its draws, attempts and pass rate,
        and how many tasks were never, sometimes and always solved."""
        tried = [r for r in self.records.values() if r.attempts]
        return {
            "mode": self.config.mode,
            "tasks": {t: {"draws": r.draws, "attempts": r.attempts, "successes": r.successes,
                          "pass_rate": r.pass_rate, "weight": round(self.weight(t), 4)}
                      for t, r in self.records.items()},
            "never_solved": sum(1 for r in tried if r.successes == 0),
            "sometimes_solved": sum(1 for r in tried if 0 < r.successes < r.attempts),
            "always_solved": sum(1 for r in tried if r.successes == r.attempts),
            "untried": len(self.records) - len(tried),
        }

    def line(self) -> str:
        """One printed line: the solve spread over tried tasks."""
        r = self.report()
        return (f"curriculum ({r['mode']}): {r['sometimes_solved']} tasks sometimes solved, "
                f"{r['never_solved']} never, {r['always_solved']} always, {r['untried']} untried")
