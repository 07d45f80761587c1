"""Canaries in a training run: mixed into the rollouts, never rewarded, counted.

Contract:
- `CanaryConfig` (`harnessrl train`'s `[canary]`): `rate` is the fraction of GRPO *groups*
  drawn from canary tasks (a group is `group_size` episodes of one task, so a canary group
  is that many canary episodes, in place of a training group: the step that consumes it
  trains on one group fewer). 0 (the default) is off.
- `CanaryMix(tasks, canaries, rate)` is the task-id iterator the scheduler draws from: draw
  n (from 0) is a canary exactly when round((n + 1) * rate) > round(n * rate) (halves up),
  so after n draws exactly round(n * rate) were canaries, spread evenly, with no RNG; the
  canaries are cycled in the order given, the other draws come from `tasks`.
- A canary episode is never rewarded: `withheld(task, graded)` is the reward the record, the
  store and every trainer get (0.0 for a graded canary; None, masked, stays None), and
  `canary_record` the metadata that keeps the grader's verdict for the cheat rate
  (`canary`, `canary_passed`: graded reward >= 1.0, `canary_reward`); `gym.cheat` counts
  them. `trainers.samples.build_samples` also leaves canary records out of samples,
  baselines and the reward mean, whatever their reward says.
- `run_canaries(config, tasks, ...)`: the run's canary tasks: the file `config.suite` (every
  row a canary, no id shared with the training tasks), or made now from up to `max_tasks` of
  the training tasks, spread over their sorted ids (`gym.tasks.synth.canary`, not verified).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.tasks import Task


class CanaryConfig(BaseModel):
    """Canary tasks mixed into a training run's rollouts (module doc)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    rate: float = Field(0.0, ge=0.0, lt=1.0)
    """Fraction of GRPO groups drawn from canary tasks, spread evenly (after n groups, round(n x
    rate) were canaries); each canary group takes a training group's place and is never
    rewarded. Its pass rate is the policy's measured propensity to cheat. 0: off."""
    suite: str | None = None
    """A canary task file (`harnessrl tasks synth --canaries-from SUITE --out DIR` writes a
    verified DIR/canaries.jsonl); None: canaries are made at the run's start from the training
    tasks (not verified) and written to out_dir/canaries.jsonl."""
    max_tasks: int = Field(4, ge=1)
    """With `suite` None: how many training tasks get a canary (spread over their sorted ids)."""


class CanaryMix:
    """Task ids for the scheduler, with canaries at `rate` (module doc)."""

    def __init__(self, tasks: Iterator[str], canaries: Sequence[str], rate: float):
        if rate and not canaries:
            raise ValueError(f"canary rate {rate} with no canary task")
        self._tasks = iter(tasks)
        self._canaries = itertools.cycle(list(canaries)) if canaries else None
        self.rate = rate if canaries else 0.0
        self.draws = 0
        self.canary_draws = 0

    def __iter__(self) -> "CanaryMix":
        return self

    def __next__(self) -> str:
        n = self.draws
        canary = self._canaries is not None and _round(n + 1, self.rate) > _round(n, self.rate)
        task = next(self._canaries) if canary else next(self._tasks)  # type: ignore[arg-type]
        self.draws += 1
        self.canary_draws += canary
        return task


def _round(n: int, rate: float) -> int:
    return int(n * rate + 0.5)


def withheld(task: Task, graded: float | None) -> float | None:
    """The reward an episode of `task` gets: 0.0 for a graded canary, else the grader's."""
    return 0.0 if task.canary and graded is not None else graded


def canary_record(graded: float | None) -> dict[str, Any]:
    """A canary episode's metadata: the grader's verdict, which its reward does not carry.
    `graded` None (the grader failed, or the episode was masked): neither passed nor failed."""
    return {"canary": True, "canary_reward": graded,
            "canary_passed": None if graded is None else graded >= 1.0}


def run_canaries(config: CanaryConfig, tasks: list[Task], out_dir: Path, source_root: str | None = None,
                 log=lambda _: None) -> list[Task]:
    """The run's canary tasks (module doc); [] when `rate` is 0. Raises ValueError naming the
    problem: a row of `suite` that is no canary, an id shared with a training task, no canary."""
    if not config.rate:
        return []
    train_ids = {t.instance_id for t in tasks}
    if config.suite is not None:
        from harnessrl.gym.tasks.loaders import load_suite

        canaries = load_suite(config.suite, source_root=source_root)
        plain = [t.instance_id for t in canaries if not t.canary]
        if plain:
            raise ValueError(f"canary.suite: {config.suite}: {plain[:3]} are not canaries (`canary: true`); make "
                             "canaries with `harnessrl tasks synth --canaries-from SUITE --out DIR`")
    else:
        from harnessrl.gym.tasks.synth.canary import make_canaries, write_canaries

        ordered = sorted(tasks, key=lambda t: t.instance_id)
        k = min(config.max_tasks, len(ordered))
        picked = [ordered[i * len(ordered) // k] for i in range(k)]
        canaries, _ = make_canaries(picked, log)
        write_canaries(canaries, Path(out_dir) / "canaries.jsonl")
    shared = sorted(train_ids & {t.instance_id for t in canaries})
    if shared:
        raise ValueError(f"canary.suite: {shared[:3]} are also training task ids")
    if not canaries:
        why = "canary.suite is empty" if config.suite else "none of the training tasks could be made one"
        raise ValueError(f"canary.rate {config.rate}: no canary task ({why})")
    return canaries
