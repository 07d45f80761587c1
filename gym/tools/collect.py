"""`harnessrl collect`: teacher episodes through the same harness, proxy and sandboxes, for SFT.

    harnessrl collect --teacher scripted --suite builtin --episodes 8 --out runs/teacher
    harnessrl collect --teacher http://host:8000/v1 --teacher-model NAME --episodes 8

The teacher is either "scripted" (each task's gold plan, `gym.doubles.scripted`, writing the
student's tokenizer ids; served on loopback, offline) or the base URL of any OpenAI-compatible
model (the proxy's pass-through, `gym.proxy.teacher`: its replies are re-rendered in the
student's chat template and tokens). Episodes run exactly as `harnessrl rollout` runs them
(`gym.rollout.Rollout`: real sandboxes, the unmodified harness, the hidden tests score each
episode); only the proxy differs, recording every call as teacher data (loss mask 1 on the
assistant tokens, logprob NaN, version -1, `flags["teacher"]`), and every trajectory's
metadata says `teacher`.

Output: `out/episodes/trajectories.jsonl` holds every episode; `out/trajectories.jsonl` the
kept ones (`keep="success"`, the default: reward >= 1.0, rejection sampling; `"all"`: every
scored episode that was not an infra failure), the file `TrainConfig.sft.data` names;
`out/report.json` the rollout report with the kept count. No RL trainer takes these records
(`trainers.samples.build_samples` refuses them); `trainers.sft` trains on them.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.rollout import Rollout, RolloutConfig, report
from harnessrl.gym.stack import load_suite_tasks
from harnessrl.gym.trajectory import Trajectory
from harnessrl.adapters import harness_arg
from harnessrl.sandboxes import sandbox_arg


class CollectConfig(BaseModel):
    """Which teacher, on which tasks, and which episodes to keep."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    teacher: str = "scripted"
    """"scripted" (the tasks' gold plans, offline) or an OpenAI-compatible base URL (…/v1)."""
    teacher_model: str = "teacher"
    """The model name sent to a URL teacher."""
    teacher_api_key: str | None = None
    """Bearer key of a URL teacher (the CLI reads HARNESSRL_TEACHER_API_KEY)."""
    keep: Literal["success", "all"] = "success"
    """"success": keep episodes with reward >= 1.0 (rejection sampling); "all": every scored,
    non-infra episode."""
    episodes: int = Field(4, ge=1)
    """Episodes to run, cycling over the suite's tasks."""
    concurrency: int = Field(2, ge=1)
    """Episodes at once."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Harness, suite, student model (its tokenizer and template), sandboxes, episode limits."""

    @property
    def label(self) -> str:
        return "scripted" if self.teacher == "scripted" else self.teacher


def kept(traj: Trajectory, keep: str) -> bool:
    if traj.status == "infra_error" or traj.reward is None:
        return False
    return keep == "all" or traj.reward >= 1.0


async def collect(cfg: CollectConfig, out_dir: str | Path, progress: bool = False,
                  tasks: list | None = None) -> dict[str, Any]:
    """Run the episodes, write the files of the module doc, return the report. `tasks`: the
    suite's tasks, loaded once by the caller (None: loaded now)."""
    if cfg.teacher != "scripted" and not cfg.teacher.startswith(("http://", "https://")):
        raise ValueError(f"teacher: {cfg.teacher!r} is neither 'scripted' nor an http(s) URL")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tasks is None:
        tasks = load_suite_tasks(cfg.rollout)
    with contextlib.ExitStack() as stack:
        if cfg.teacher == "scripted":
            from harnessrl.gym.doubles.scripted import ScriptedEngine
            from harnessrl.gym.models import load_tokenizer
            from harnessrl.gym.served import ServedApp

            engine = ScriptedEngine(load_tokenizer(cfg.rollout.model))
            engine.set_tasks(tasks)
            engine_url = stack.enter_context(ServedApp(engine.app())).url
            fields: dict[str, Any] = {"teacher": "scripted"}
        else:  # the URL is the "engine" episodes judge failures by: an unreachable teacher masks them
            engine_url = cfg.teacher
            fields = {"teacher_url": cfg.teacher, "teacher_model": cfg.teacher_model,
                      "teacher_api_key": cfg.teacher_api_key}
        with Rollout(cfg.rollout, engine_url, out / "episodes", tasks=tasks, proxy_fields=fields) as ro:
            order = list(itertools.islice(itertools.cycle(sorted(ro.tasks)), cfg.episodes))
            ro.prewarm(order[:cfg.concurrency])
            sem = asyncio.Semaphore(cfg.concurrency)
            t0 = time.monotonic()

            async def one(task_id: str) -> Trajectory:
                async with sem:
                    traj = await ro.run_cancellable(task_id, {"teacher": cfg.label})
                if progress:
                    print(f"{task_id}: reward {traj.reward} ({traj.status}, {traj.termination})", file=sys.stderr)
                return traj

            done = await asyncio.gather(*(one(t) for t in order))
            wall = time.monotonic() - t0
    keep = [t for t in done if kept(t, cfg.keep)]
    with open(out / "trajectories.jsonl", "w") as f:
        for t in keep:
            t.metadata["teacher"] = cfg.label
            f.write(t.to_json() + "\n")
    rep = report(list(done), wall)
    rep.update({"teacher": cfg.label, "keep": cfg.keep, "kept": len(keep), "harness": cfg.rollout.harness,
                "suite": cfg.rollout.suite, "model": cfg.rollout.model,
                "trajectories": str(out / "trajectories.jsonl")})
    (out / "report.json").write_text(json.dumps(rep, indent=2))
    return rep


def main(argv: list[str] | None = None) -> int:
    from harnessrl.gym.episode import EpisodeConfig

    p = argparse.ArgumentParser(prog="harnessrl collect", description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", default="scripted", help="'scripted' (gold plans) or an OpenAI-compatible base URL")
    p.add_argument("--teacher-model", default="teacher", help="model name sent to a URL teacher")
    p.add_argument("--harness", default="mini-swe-agent", type=harness_arg)
    p.add_argument("--suite", default="builtin")
    p.add_argument("--source-root", default=None, metavar="DIR",
                   help="folder holding the repositories a task file names (owner__name, name or name.bundle)")
    p.add_argument("--model", default="smollm2-135m", help="the student: its tokenizer and chat template")
    p.add_argument("--tasks", nargs="*", default=None, help="instance ids (default: all)")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-calls", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--wall-time", type=float, default=600.0)
    p.add_argument("--sandbox", default="auto", type=sandbox_arg, help="auto, a sandbox backend name or module:Class")
    p.add_argument("--keep", default="success", choices=["success", "all"],
                   help="success: only episodes with reward 1.0 (rejection sampling); all: every scored episode")
    p.add_argument("--out", default="runs/teacher")
    a = p.parse_args(argv)
    try:
        cfg = CollectConfig(teacher=a.teacher, teacher_model=a.teacher_model,
                            teacher_api_key=os.environ.get("HARNESSRL_TEACHER_API_KEY"), keep=a.keep,
                            episodes=a.episodes, concurrency=a.concurrency, rollout=RolloutConfig(
                                harness=a.harness, suite=a.suite, source_root=a.source_root, model=a.model, tasks=a.tasks, sandbox=a.sandbox,
                                max_new_tokens=a.max_new_tokens,
                                episode=EpisodeConfig(max_calls=a.max_calls, wall_time_s=a.wall_time)))
        rep = asyncio.run(collect(cfg, a.out, progress=True))
    except (ValueError, FileNotFoundError, KeyError) as e:
        print("\n".join(f"harnessrl collect: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2))
    return 0
