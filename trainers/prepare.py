"""Data a learning run makes for itself when it is missing: synthesized tasks, teacher episodes.

Contract (`await prepare_data(cfg)`, called by `train` before anything starts):
1. `prepare.tasks_dir` without a manifest.json: `harnessrl tasks synth` into it
   (`gym.tasks.synth.synthesize` with `prepare.synth`); with one, its config must match
   `prepare.synth` (a folder made with other settings is refused, never silently reused);
2. the sft stage's `sft.data` missing and `prepare.teacher_episodes` > 0: `harnessrl collect`
   with the scripted gold teacher on the RL tasks (`rollout.suite`, the run's harness, model
   and episode limits; with `prepare.teacher_spread`, that many tasks spread over their ids)
   into the folder of `sft.data`. Held-out tasks are never collected on:
   `train` checks the RL tasks, the teacher records and the held-out tasks are disjoint
   (`trainers.evaluate.guard_disjoint`) before it trains.
Both outputs depend only on their settings, so several runs (seeds of the trainer) share them.

`RunTasks(cfg)`: the run's suites (RL, held-out), each loaded once, after this preparation
made them, and handed to everything that runs episodes (`train` passes it down).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class PrepareError(ValueError):
    """Data could not be made (or a folder made with other settings is in the way)."""


class PrepareConfig(BaseModel):
    """What `harnessrl train` makes first when it is missing (nothing, by default)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tasks_dir: str | None = None
    """Folder of synthesized tasks (train.jsonl, heldout.jsonl, meta.jsonl, repos/); made with
    `synth` when it has no manifest.json. Point `rollout.suite` at its train.jsonl and
    `eval.suite` at its heldout.jsonl. None: no synthesis."""
    synth: dict[str, Any] = Field(default_factory=dict)
    """`harnessrl tasks synth` settings (gym.tasks.synth.SynthConfig fields but `out`: seed,
    max_tasks, project, easy_fraction, ...)."""
    teacher_episodes: int = Field(0, ge=0)
    """Scripted gold-teacher episodes on the RL tasks when `sft.data` is missing (0: never collect)."""
    teacher_concurrency: int = Field(2, ge=1)
    """Teacher episodes at once."""
    teacher_spread: bool = False
    """Teacher episodes on `teacher_episodes` RL tasks spread evenly over their sorted ids (so
    over the projects of a synthesized set), one each; False: cycle over the RL tasks in id
    order (the first tasks, all of the first project in a synthesized set)."""

    @model_validator(mode="after")
    def _synth_fields(self) -> "PrepareConfig":
        if self.tasks_dir is None:
            if self.synth:
                raise ValueError("prepare.synth: set prepare.tasks_dir, the folder to synthesize into")
            return self
        if "out" in self.synth:
            raise ValueError("prepare.synth.out: the output folder is prepare.tasks_dir")
        self.synth_config()
        return self

    def synth_config(self):
        from harnessrl.gym.tasks.synth.run import SynthConfig

        try:
            return SynthConfig(**self.synth, out=str(self.tasks_dir))
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"prepare.synth.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


class RunTasks:
    """A training run's tasks, each suite loaded once, on first use (so after `prepare_data` made
    them), and handed to every part that runs episodes: the RL rollouts, the teacher, the
    held-out guard and every evaluation point. `rl`: the RL tasks if the caller loaded them
    already (the CLI checks them before anything starts)."""

    def __init__(self, cfg: Any, rl: list | None = None):
        self.cfg, self._rl, self._held = cfg, rl, None

    @property
    def rl(self) -> list:
        """The RL tasks (`rollout.suite`, narrowed by `rollout.tasks` and `rollout.difficulties`)."""
        if self._rl is None:
            from harnessrl.gym.stack import load_suite_tasks

            self._rl = load_suite_tasks(self.cfg.rollout)
        return self._rl

    @property
    def held(self) -> list:
        """The held-out suite (`eval.suite`, narrowed by `eval.difficulties`); [] without evaluation."""
        if self._held is None:
            from harnessrl.gym.stack import load_suite_tasks
            from harnessrl.trainers.evaluate import rollout_config

            ev = self.cfg.eval
            self._held = load_suite_tasks(rollout_config(ev, self.cfg.rollout)) if ev.enabled else []
        return self._held


async def check_context(cfg: Any, tasks: RunTasks, log=print) -> dict[str, Any]:
    """Before anything starts: every harness of the run (`rollout.harnesses`, else `harness`, and
    `eval.harnesses`) has
    its first prompt measured by a probe episode (`gym.context_probe`) on the longest of the
    tasks the run rolls out (RL and held-out), and a harness whose prompt does not fit the context
    (`rollout.context_length`, else the model's) is refused, named (`ContextTooLong`).
    Returns the context and each harness's first prompt in tokens (report.json "context")."""
    from harnessrl.gym.context_probe import check_context as probe
    from harnessrl.gym.models import context_length

    context = cfg.rollout.context_length or context_length(cfg.model)
    pool = (tasks.rl if "rl" in cfg.stages else []) + tasks.held
    run = cfg.rollout.model_copy(update={"model": cfg.model})
    sizes = await probe(run, pool, context)
    if cfg.eval.enabled and cfg.eval.harnesses and set(cfg.eval.harnesses) - set(sizes):
        from harnessrl.trainers.evaluate import rollout_config  # the held-out tasks' harnesses too (transfer)

        sizes |= await probe(rollout_config(cfg.eval, run), tasks.held, context)
    log("context: first prompt " + ", ".join(f"{h} {n}" for h, n in sizes.items()) + f" tokens of {context}")
    return {"length": context, "first_prompt_tokens": sizes}


async def prepare_data(cfg: Any, log=print, tasks: RunTasks | None = None) -> dict[str, Any]:
    """Steps 1 and 2 of the module doc for a TrainConfig; returns what was made and its seconds.
    `tasks`: the run's tasks (the teacher runs on its RL tasks)."""
    p: PrepareConfig = cfg.prepare
    made: dict[str, Any] = {}
    if p.tasks_dir is not None:
        made["synth"] = await asyncio.to_thread(_synth, p, log)
    if "sft" in cfg.stages and p.teacher_episodes and cfg.sft.data and not Path(cfg.sft.data).exists():
        made["collect"] = await _collect(cfg, log, tasks or RunTasks(cfg))
    return made


def _synth(p: PrepareConfig, log) -> dict[str, Any]:
    sc = p.synth_config()
    manifest = Path(sc.out) / "manifest.json"
    if manifest.exists():
        have = json.loads(manifest.read_text()).get("config", {})
        want = json.loads(sc.model_dump_json())
        fields = type(sc).model_fields  # a field added since the folder was made counts at its default
        differ = sorted(k for k in want if k not in ("out", "backend", "verify_workers")
                        and have.get(k, fields[k].default) != want[k])
        if differ:
            raise PrepareError(f"prepare.tasks_dir: {sc.out} was synthesized with other settings ({', '.join(differ)}: "
                             f"{[have.get(k) for k in differ]} there, {[want[k] for k in differ]} asked); "
                             "remove it or name another folder")
        return {"tasks_dir": sc.out, "made": False}
    from harnessrl.gym.tasks.synth.run import synthesize

    log(f"prepare: synthesizing tasks into {sc.out} ({json.dumps(p.synth)}); this runs once")
    t0 = time.monotonic()
    m = synthesize(sc, log=lambda line: log(f"  synth: {line}"))
    if not m.get("tasks"):
        raise PrepareError(f"prepare.synth: synthesis wrote no task into {sc.out}")
    log(f"prepare: {m['tasks']} tasks ({m['by_split']}) in {time.monotonic() - t0:.0f}s")
    return {"tasks_dir": sc.out, "made": True, "tasks": m["tasks"], "by_split": m["by_split"],
            "seconds": round(time.monotonic() - t0, 1)}


async def _collect(cfg: Any, log, tasks: RunTasks) -> dict[str, Any]:
    from harnessrl.gym.tools.collect import CollectConfig, collect

    out = Path(cfg.sft.data).parent
    rollout = cfg.rollout.model_copy(update={"model": cfg.model})
    log(f"prepare: {cfg.prepare.teacher_episodes} scripted-teacher episodes on {rollout.suite} into {out}")
    t0 = time.monotonic()
    picked = spread(tasks.rl, cfg.prepare.teacher_episodes) if cfg.prepare.teacher_spread else tasks.rl
    rep = await collect(CollectConfig(teacher="scripted", episodes=cfg.prepare.teacher_episodes,
                                            concurrency=cfg.prepare.teacher_concurrency, rollout=rollout), out,
                        tasks=picked)
    if not rep["kept"]:
        raise PrepareError(f"prepare.teacher_episodes: none of {rep['episodes']} teacher episodes succeeded "
                         f"({rep['endings']}); see {out}/episodes/trajectories.jsonl")
    log(f"prepare: kept {rep['kept']} of {rep['episodes']} teacher episodes in {time.monotonic() - t0:.0f}s")
    return {"data": cfg.sft.data, "kept": rep["kept"], "episodes": rep["episodes"],
            "seconds": round(time.monotonic() - t0, 1)}


def spread(tasks: list, n: int) -> list:
    """`n` of `tasks` spread evenly over their sorted instance ids (all of them when n >= len)."""
    ids = sorted(t.instance_id for t in tasks)
    if n >= len(ids):
        return list(tasks)
    keep = {ids[i * len(ids) // n] for i in range(n)}
    return [t for t in tasks if t.instance_id in keep]
