"""Held-out evaluation inside `harnessrl train`: the same tasks, before SFT, after SFT, after RL.

Contract: `evaluate(point, ...)` runs `episodes_per_task` real episodes of every held-out task
through the run's own rollout machinery (`gym.rollout.Rollout`: the engine at the weights it
serves now, a proxy of its own, sandboxes, the unmodified harness, the hidden tests) and
returns that point's figures (`summarize`): n, successes, success rate with its Wilson 95%
interval, mean reward, and why each episode that did not succeed failed (`outcome`, read
from its record). Records go to `out_dir/eval/<point>/` and carry `metadata["eval"]`; no
trainer takes them (`trainers.samples` refuses them; they are never handed to the scheduler).
With several harnesses (`rollout.harnesses`, or `eval.harnesses`: a harness the policy was not
trained with measures transfer) every held-out task runs through each of them, and the summary
adds `by_harness`: each harness's own figures, one printed line each. With
`episodes_per_task` k > 1 the summary's `pass_at_1` is the mean over tasks of each task's share
of successes, with a task-bootstrap 95% interval (`trainers.eval_stats`); with `greedy`, one
more greedy episode per task (`summary["greedy"]`, per-task 0/1 for the McNemar test between
points: `eval_stats.paired_points`).

`guard_disjoint(...)` refuses a run whose held-out tasks reach SFT or RL: by instance id, by
gold patch, and by mutated function when the task files sit beside their `meta.jsonl`
(`harnessrl tasks synth`).
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harnessrl.adapters import HarnessName
from harnessrl.gym.rollout import Rollout, RolloutConfig
from harnessrl.gym.stack import load_suite_tasks
from harnessrl.gym.trajectory import CallRecord, Trajectory
from harnessrl.trainers.eval_stats import pass_at_1

Point = Literal["pre_sft", "post_sft", "post_rl"]
POINTS: tuple[str, ...] = ("pre_sft", "post_sft", "post_rl")

#: Why an episode ended as it did, from its record (`outcome`), in the order they are checked.
OUTCOMES = ("masked_infra", "success", "harness_error", "no_tool_call", "limit", "wrong_edit")


class EvalConfig(BaseModel):
    """The held-out evaluation of a training run (off while `suite` is unset)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    suite: str | None = None
    """The held-out task file (e.g. the heldout.jsonl of `harnessrl tasks synth`) or suite name;
    None: no evaluation."""
    source_root: str | None = None
    """Folder of the repositories its rows name but do not ship (as `rollout.source_root`)."""
    difficulties: list[str] | None = None
    """Only held-out tasks of these difficulties (None: all)."""
    max_tasks: int | None = Field(None, ge=1)
    """N held-out tasks spread evenly over the instance ids in order (so over the projects),
    the same at every point (None: all); fixed before any result is seen."""
    episodes_per_task: int = Field(1, ge=1)
    """Episodes of each task at each point, at `temperature` (k: pass@1 is the mean over them)."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature of evaluation episodes (0: greedy; None: `rollout.temperature`)."""
    greedy: bool = False
    """Also one greedy episode (temperature 0) of every task at every point, apart from the
    sampled ones (records in eval/<point>/greedy/; the exact McNemar test between points reads them)."""
    harnesses: list[HarnessName] | None = None
    """The harnesses every held-out task runs through, each reported on its own (`by_harness`):
    name one the policy was not trained with to measure transfer (e.g. ["mini-swe-agent",
    "aider"] for a run trained through mini-swe-agent); names as `rollout.harness` takes them.
    None: the run's own harnesses."""
    transfer_episodes_per_task: int | None = Field(None, ge=0)
    """Sampled episodes of each task through the `harnesses` the run does not train with (its
    transfer harnesses), when they should cost less than `episodes_per_task` (None: the same k);
    0 with `greedy`: only the greedy episode (their greedy k/n and McNemar test, no pass@1).
    A harness with a 6-7k-token prompt (aider) costs minutes an episode on CPU."""
    points: list[Point] | None = None
    """When to evaluate: "pre_sft" (the starting weights), "post_sft" (after the sft stage),
    "post_rl" (after the last RL step); only points the run's stages reach are allowed.
    None: every point the stages reach."""
    concurrency: int = Field(2, ge=1)
    """Evaluation episodes at once."""

    @model_validator(mode="after")
    def _greedy_apart(self) -> "EvalConfig":
        if self.greedy and self.temperature == 0:
            raise ValueError("eval.greedy: the sampled episodes are already greedy (eval.temperature = 0)")
        if self.harnesses is not None and (not self.harnesses or len(set(self.harnesses)) != len(self.harnesses)):
            raise ValueError(f"eval.harnesses: {self.harnesses} must name at least one harness, none twice")
        if self.transfer_episodes_per_task == 0 and not self.greedy:
            raise ValueError("eval.transfer_episodes_per_task: 0 leaves the transfer harnesses no episode "
                             "unless eval.greedy is on")
        return self

    @property
    def enabled(self) -> bool:
        return self.suite is not None and self.points != []

    def points_for(self, stages: list[str]) -> list[str]:
        """The points a run of these stages evaluates at, in run order."""
        if self.points is not None:
            return [p for p in POINTS if p in self.points]
        return [p for p in POINTS if p == "pre_sft" or (p == "post_sft" and "sft" in stages)
                or (p == "post_rl" and "rl" in stages)]


def rollout_config(ev: EvalConfig, base: RolloutConfig) -> RolloutConfig:
    """The run's rollout settings (harness, sandboxes, episode limits, model) on the held-out tasks."""
    assert ev.suite is not None
    update = {"suite": ev.suite, "source_root": ev.source_root, "tasks": None, "difficulties": ev.difficulties,
              "temperature": base.temperature if ev.temperature is None else ev.temperature}
    if ev.harnesses is not None:  # validated as `rollout.harnesses` is (names, equal weights)
        update |= {"harness": ev.harnesses[0], "harnesses": list(ev.harnesses) if len(ev.harnesses) > 1 else None}
        return RolloutConfig.model_validate(base.model_dump() | update)
    return base.model_copy(update=update)


def eval_task_ids(ev: EvalConfig, base: RolloutConfig, tasks: list | None = None) -> list[str]:
    """The held-out tasks every point runs, in id order (`max_tasks` of them spread evenly).
    `tasks`: the held-out suite, loaded once by the run (None: loaded now)."""
    if tasks is None:
        tasks = load_suite_tasks(rollout_config(ev, base))
    ids = sorted(t.instance_id for t in tasks)
    if not ev.max_tasks or ev.max_tasks >= len(ids):
        return ids
    return [ids[i * len(ids) // ev.max_tasks] for i in range(ev.max_tasks)]


# -- one evaluation point ------------------------------------------------------------------------
async def evaluate(point: str, ev: EvalConfig, base: RolloutConfig, engine_url: str | list[str], out_dir: str | Path, *,
                   generation_backend: Any = None, episode_timeout_s: float | None = None,
                   tasks: list | None = None) -> dict[str, Any]:
    """Run the point's episodes, write `<out_dir>/eval/<point>/summary.json`, return the summary.
    An episode past `episode_timeout_s` is cancelled (its sandbox closed) and counted as masked.
    With `ev.greedy`, one greedy episode per task and harness follows (`summary["greedy"]`).
    `tasks`: the held-out suite, loaded once by the run (None: loaded now)."""
    folder = Path(out_dir) / "eval" / point
    cfg = rollout_config(ev, base)
    if tasks is None:
        tasks = load_suite_tasks(cfg)
    ids = eval_task_ids(ev, base, tasks)
    t0 = time.monotonic()
    picked = [t for t in tasks if t.instance_id in set(ids)]
    run = cfg.model_copy(update={"tasks": ids, "difficulties": None})
    kw = dict(generation_backend=generation_backend, episode_timeout_s=episode_timeout_s, concurrency=ev.concurrency)
    trained = set(base.harnesses or [base.harness])
    k_of = {h: ev.episodes_per_task if h in trained or ev.transfer_episodes_per_task is None
            else ev.transfer_episodes_per_task for h in (cfg.harnesses or [cfg.harness])}
    summary = await _point(point, run, engine_url, folder, ids, picked, k_of, **kw)
    if ev.greedy:
        greedy = await _point(point, run.model_copy(update={"temperature": 0.0}), engine_url, folder / "greedy",
                              ids, picked, dict.fromkeys(k_of, 1), **kw)
        summary["greedy"] = _greedy_view(greedy)
        for h, sub in (greedy.get("by_harness") or {}).items():
            summary["by_harness"][h]["greedy"] = _greedy_view(sub)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    summary["tasks"] = len(ids)
    # the run's k; with several harnesses each one's own k is on its by_harness entry
    summary["samples_per_task"] = ev.episodes_per_task if len(k_of) > 1 else next(iter(k_of.values()))
    summary["records"] = str(folder / "trajectories.jsonl")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def _point(point: str, run: RolloutConfig, engine_url: str, folder: Path, ids: list[str], tasks: list,
                 k_of: dict[str, int], *, generation_backend: Any, episode_timeout_s: float | None,
                 concurrency: int) -> dict[str, Any]:
    """`k_of[harness]` episodes of every task through each harness of `run`, summarized (with
    `by_harness` when there are several), records in `folder`."""
    with Rollout(run, engine_url, folder, generation_backend=generation_backend, tasks=tasks) as ro:
        harnesses = list(ro.stack.adapters)  # every held-out task through each harness of the run
        ks = dict(zip(harnesses, k_of.values()))  # adapters are built in the config's order (names may differ)
        order = [(t, h) for h in harnesses for t in ids for _ in range(ks[h])]
        ro.prewarm([t for t, _ in order[:concurrency]], [h for _, h in order[:concurrency]])
        sem = asyncio.Semaphore(concurrency)

        async def one(task_id: str, harness: str) -> Trajectory | None:
            async with sem:
                try:
                    traj = await asyncio.wait_for(ro.run_cancellable(task_id, {"eval": point}, harness),
                                                  episode_timeout_s)
                except asyncio.TimeoutError:
                    return None
            traj.metadata["eval"] = point
            return traj

        done = await asyncio.gather(*(one(t, h) for t, h in order))
        made_tool_call = tool_call_reader(ro.proxy.core.renderer)
    trajs = [t for t in done if t is not None]
    summary = summarize(point, trajs, made_tool_call, timed_out=len(done) - len(trajs))
    if len(harnesses) > 1:
        summary["by_harness"] = {
            h: summarize(point, [t for t in trajs if t.harness == h], made_tool_call,
                         timed_out=sum(1 for t, (_, oh) in zip(done, order) if t is None and oh == h))
            | {"samples_per_task": ks[h]}
            for h in harnesses}
    return summary


def _greedy_view(s: dict[str, Any]) -> dict[str, Any]:
    """A greedy point's figures: one episode a task, so `by_task` is 1 (passed) or 0."""
    return {"n": s["n"], "successes": s["successes"], "success_rate": s["success_rate"], "ci95": s["ci95"],
            "outcomes": s["outcomes"], "by_task": {t: int(r[0] >= 1.0) for t, r in s["by_task"].items() if r}}


def tool_call_reader(renderer: Any) -> Callable[[CallRecord], bool]:
    """Whether a recorded reply held a well-formed call of one of the harness's tools: its
    completion decoded and parsed as the proxy parsed it (its renderer's tool format), and no
    parse flag on the record (`flags["tool_call"]`: bad JSON, truncated, or a tool the request
    did not offer, such as a file name). The record flags only failed parses, not good ones."""
    def made(c: CallRecord) -> bool:
        if c.flags.get("tool_call"):
            return False
        return bool(renderer.tool_format.parse(renderer.decode(c.completion_ids), []).tool_calls)
    return made


def outcome(t: Trajectory, made_tool_call: Callable[[CallRecord], bool]) -> str:
    """One of OUTCOMES for a finished episode record:
    masked_infra: not scored (an infra failure: sandbox, engine, proxy, cancelled);
    success: reward >= 1; harness_error: the harness crashed; no_tool_call: no reply held a
    well-formed call of an offered tool (a format error: nothing was run); limit: it ran commands
    but hit the call limit or the wall time; wrong_edit: it ended by itself, the tests failed."""
    if t.status == "infra_error" or t.reward is None:
        return "masked_infra"
    if t.reward >= 1.0:
        return "success"
    if t.termination == "harness_crashed":
        return "harness_error"
    if not any(made_tool_call(c) for c in t.delivered_calls):
        return "no_tool_call"
    if t.termination in ("call_limit", "timeout"):
        return "limit"
    return "wrong_edit"


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float | None, float | None]:
    """The Wilson score interval of k successes in n trials (95% for the default z):
    (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n); (None, None) when n is 0."""
    if n == 0:
        return None, None
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(point: str, trajs: Iterable[Trajectory], made_tool_call: Callable[[CallRecord], bool],
              timed_out: int = 0) -> dict[str, Any]:
    """The point's figures. Rates are over scored episodes (masked ones are counted apart, never
    as 0); `outcomes` counts every episode, `timed_out` ones as masked_infra."""
    trajs = list(trajs)
    counts = Counter({k: 0 for k in OUTCOMES})
    counts.update(outcome(t, made_tool_call) for t in trajs)
    counts["masked_infra"] += timed_out
    scored = [t for t in trajs if outcome(t, made_tool_call) != "masked_infra"]
    k, n = counts["success"], len(scored)
    lo, hi = wilson(k, n)
    calls = [c for t in scored for c in t.delivered_calls]
    by_task = {tid: [t.reward for t in scored if t.task_id == tid] for tid in sorted({t.task_id for t in scored})}
    p1, p1_ci = pass_at_1(by_task)
    return {
        "point": point, "n": n, "episodes": len(trajs) + timed_out, "successes": k,
        "success_rate": k / n if n else None, "ci95": [lo, hi],
        "reward_mean": sum(float(t.reward) for t in scored) / n if n else None,
        "outcomes": dict(counts),
        "tool_call_rate": sum(made_tool_call(c) for c in calls) / len(calls) if calls else None,
        "calls_per_episode": len(calls) / n if n else None,
        "by_task": by_task, "pass_at_1": p1, "pass_at_1_ci95": p1_ci,
    }


def line(s: dict[str, Any]) -> str:
    """One printed line per point: success k/n, rate, CI, mean reward, failure reasons; with
    several harnesses one more line per harness, indented, the harness named."""
    out = _one_line(s)
    for h, sub in (s.get("by_harness") or {}).items():
        out += "\n    " + _one_line(sub).replace(f"eval {s['point']:<8}", f"{h}:", 1)
    return out


def _failed(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in outcomes.items() if v and k != "success") or "none"


def _one_line(s: dict[str, Any]) -> str:
    g = s.get("greedy")
    if not s["n"] and g and g["n"]:  # a transfer harness evaluated by its greedy episodes only
        lo, hi = g["ci95"]
        return (f"eval {s['point']:<8} greedy only: success {g['successes']}/{g['n']} = {g['success_rate']:.2f} "
                f"(95% CI {lo:.2f}-{hi:.2f})  failed: {_failed(g['outcomes'])}")
    if not s["n"]:
        return f"eval {s['point']:<8} no scored episode ({s['episodes']} run): {s['outcomes']}"
    lo, hi = s["ci95"]
    why = _failed(s["outcomes"])
    p1, (plo, phi) = s.get("pass_at_1"), s.get("pass_at_1_ci95") or (None, None)
    return (f"eval {s['point']:<8} success {s['successes']}/{s['n']} = {s['success_rate']:.2f} "
            f"(95% CI {lo:.2f}-{hi:.2f})  reward {s['reward_mean']:.3f}"
            + (f"  pass@1 {p1:.3f} (95% CI {plo:.2f}-{phi:.2f}, {s['samples_per_task']} a task)"
               if p1 is not None and s.get("samples_per_task", 1) > 1 else "")
            + (f"  greedy {g['successes']}/{g['n']}" if g and g["n"] else "")
            + f"  failed: {why}")


# -- the guard: held-out tasks never reach SFT or RL ------------------------------------------------
class LeakError(ValueError):
    """A held-out task (or its function) is among the tasks the run trains on."""


def guard_disjoint(train_tasks: list, eval_tasks: list, sft_task_ids: Iterable[str] = (),
                   train_meta: str | Path | None = None, eval_meta: str | Path | None = None) -> None:
    """Raise LeakError naming the overlap between held-out tasks and the RL tasks or SFT records:
    the same instance id, the same gold patch as an RL task, or (with both meta.jsonl files) a
    function that an RL task or an SFT record's task mutates."""
    held = {t.instance_id: t for t in eval_tasks}
    sft_task_ids = set(sft_task_ids)
    rl = sorted(set(held) & {t.instance_id for t in train_tasks})
    if rl:
        raise LeakError(f"eval.suite: held-out task(s) {rl[:5]} are also RL tasks (rollout.suite)")
    sft = sorted(set(held) & set(sft_task_ids))
    if sft:
        raise LeakError(f"sft.data: holds teacher episodes of held-out task(s) {sft[:5]}")
    patches = {t.patch: t.instance_id for t in train_tasks if t.patch}
    same = sorted(f"{i} = {patches[t.patch]}" for i, t in held.items() if t.patch and t.patch in patches)
    if same:
        raise LeakError(f"eval.suite: held-out task(s) with the gold patch of an RL task: {same[:5]}")
    if train_meta and eval_meta and Path(train_meta).exists() and Path(eval_meta).exists():
        seen = _functions(train_meta, {t.instance_id for t in train_tasks} | set(sft_task_ids))
        shared = sorted({f"{'/'.join(f)}" for f in _functions(eval_meta, set(held)) & seen})
        if shared:
            raise LeakError(f"eval.suite: held-out tasks mutate function(s) that RL tasks mutate: {shared[:5]}")


def _functions(meta: str | Path, ids: set[str]) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for row in Path(meta).read_text().splitlines():
        d = json.loads(row)
        if d.get("instance_id") in ids:
            out |= {tuple(f) for f in d.get("functions") or []}
    return out


def meta_beside(suite: str | None) -> Path | None:
    """The meta.jsonl of a synthesized task set: next to a task file, or shipped with a named suite."""
    from harnessrl.gym.tasks.loaders import suite_meta

    return suite_meta(suite)
