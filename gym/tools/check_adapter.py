"""`harnessrl check-adapter NAME|CONFIG`: the contract checks a new adapter or config must pass.

    python -m harnessrl.gym.tools.check_adapter examples/harnesses/codex.toml

Runs, on real parts (the sandbox backend, the proxy, the scripted policy with the real
tokenizer): (1) it loads and declares valid capabilities; (2) its harness is installed;
(3) a gold-plan episode on a built-in task (`--suite DIR`: a Harbor folder's first task with
solution/solve.sh) ends `submitted`/`harness_exited` with reward 1.0
and a token-exact record (each recorded call's prompt and completion ids are exactly what
the engine was given and returned; each segment's loss mask marks exactly the sampled ids);
(4) an empty-plan episode scores 0.0; (5) every ending carries its reason into the stored
trajectory; (6) the harness's first prompt fits the model's context (`--model`'s
max_position_embeddings, or `--context-length`; tokens as the scripted run's SmolLM2 tokenizer
counts them): a harness whose system prompt and tools alone outgrow it fails here, with both
numbers, not in the first rollout. A failing episode check shows the harness's exit code and
the end of its stderr/stdout, and the JSON line keeps each episode's exit code and stream tails.
Prints one line per check and ends with one JSON line; exit status 0 iff all pass.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from harnessrl.adapters import get_adapter
from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.models import context_length
from harnessrl.registry import DIALECTS


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckReport:
    adapter: str
    checks: list[Check] = field(default_factory=list)
    harness: dict[str, dict] = field(default_factory=dict)
    """Per episode ("gold", "empty"): the harness's exit code, reason and stream tails."""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)


def token_exact_problems(traj: Any, engine_calls: list[Any]) -> list[str]:
    """Why a trajectory is not token-exact against the engine's own log (empty: it is)."""
    problems: list[str] = []
    if not traj.calls:
        return ["no model call was recorded"]
    sent = {tuple(c.prompt_ids): c for c in engine_calls}
    for rec in traj.calls:
        got = sent.get(tuple(rec.prompt_ids))
        if got is None:
            problems.append(f"call {rec.index}: its prompt ids were never sent to the engine")
        elif rec.completion_ids != got.output_ids:
            problems.append(f"call {rec.index}: recorded completion ids differ from the sampled ones")
    try:
        traj.validate()
    except ValueError as e:
        problems.append(str(e))
    for i, seg in enumerate(traj.segments):
        calls = [c for c in traj.calls if c.call_id in seg.call_ids] or [c for c in traj.calls if c.segment == i]
        if not calls:
            problems.append(f"segment {i}: no call belongs to it")
            continue
        full = calls[-1].prompt_ids + calls[-1].completion_ids
        if seg.token_ids[:len(full)] != full:
            problems.append(f"segment {i}: its tokens do not start with its last call's prompt + completion")
        masked = [t for t, m in zip(seg.token_ids, seg.loss_mask) if m == 1]
        if masked != [t for c in calls for t in c.completion_ids]:
            problems.append(f"segment {i}: loss-masked tokens are not exactly the sampled ones")
    return problems


def _capabilities(report: CheckReport, adapter: Any) -> bool:
    bad = []
    for attr, ok in (("name", isinstance(getattr(adapter, "name", None), str)),
                     ("dialect", getattr(adapter, "dialect", None) in DIALECTS),
                     ("placement", getattr(adapter, "placement", None) in ("inside", "beside")),
                     ("streams", isinstance(getattr(adapter, "streams", None), bool)),
                     ("version", isinstance(getattr(adapter, "version", None), str)),
                     ("install", isinstance(getattr(adapter, "install", None), str)),
                     ("completion", isinstance(getattr(adapter, "completion", None), str)),
                     ("launch", callable(getattr(adapter, "launch", None))),
                     ("mounts", callable(getattr(adapter, "mounts", None)))):
        if not ok:
            bad.append(attr)
    return report.add("capabilities", not bad, f"missing or invalid: {bad}" if bad else
                      f"{adapter.dialect}, {adapter.placement}, streams={adapter.streams}, {adapter.install}")


def _installed(report: CheckReport, adapter: Any) -> bool:
    if callable(getattr(adapter, "check_installed", None)):  # a harness config: its own install target
        from harnessrl.adapters.toolchain import HarnessNotInstalled, NodeTooOld

        try:
            adapter.check_installed()
        except (HarnessNotInstalled, NodeTooOld) as e:
            return report.add("installed", False, str(e))
        return report.add("installed", True, adapter.install if adapter.install_dir else
                          "user-provided (install = none): not checked")
    kind, _, spec = adapter.install.partition(":")
    if kind not in ("npm", "pip"):
        return report.add("installed", True, "user-provided (install = none): not checked")
    name = getattr(adapter, "toolchain_dir", None) or adapter.name.removesuffix("-cmd")
    got = installed_spec("npm" if kind == "npm" else "venvs", name)
    return report.add("installed", got == spec, f"toolchain has {got!r}, want {spec!r}"
                      + ("" if got == spec else f": run scripts/install_harnesses.sh {name}"))


def _fits(report: CheckReport, traj: Any, context: int, model: str) -> bool:
    if not traj.calls:
        return report.add("first prompt fits the context", False, "no model call was recorded, so nothing to measure")
    first = traj.calls[0]
    n = first.flags.get("prompt_tokens") or len(traj.call_prompt(first))  # a refused one is counted by the proxy
    return report.add("first prompt fits the context", n < context,
                      f"first prompt {n} tokens, context length {context} ({model})"
                      + ("" if n < context else ": the harness's own system prompt and tools do not fit; "
                                                "use a model with a longer context or trim the harness's prompt"))


def _episode_detail(res: Any) -> str:
    h = res.harness
    return f" [{h.account(600)}]" if h is not None and h.exit_code != 0 else ""


def check_adapter(target: str, backend: str = "auto", wall_time_s: float = 300.0, model: str = "smollm2-135m",
                  context: int | None = None, suite: str = "builtin") -> CheckReport:
    """The checks, on `suite`'s first task with a gold plan (a Harbor folder's: solution/solve.sh)."""
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.stack import EpisodeStack
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.sandboxes import make_backend

    report = CheckReport(target)
    try:
        adapter = get_adapter(target)
    except (ValueError, OSError) as e:
        report.add("loads", False, str(e))
        return report
    report.add("loads", True, type(adapter).__name__)
    if not (_capabilities(report, adapter) and _installed(report, adapter)):
        return report
    try:
        context, model = (context, "--context-length") if context else (context_length(model), model)
    except (OSError, KeyError, ValueError) as e:
        report.add("model context", False, f"{model}: {e}")
        return report
    try:
        task = next(t for t in load_suite(suite) if t.gold_plan)
    except (ValueError, StopIteration) as e:  # TaskFileError is a ValueError
        report.add("gold task", False, f"suite {suite!r}: {str(e) or 'no task has a gold plan'}")
        return report
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    stack = EpisodeStack(RolloutConfig(model="tiny-llama", sandbox_pool_size=0,
                                       episode=EpisodeConfig(max_calls=10, wall_time_s=wall_time_s)),
                         tasks=[task], adapter=adapter, sandbox_backend=make_backend(backend))
    # the proxy's default token limits, not a training run's cap: the harness asks for what it asks for
    with ServedApp(engine.app()) as served, \
            stack.proxy(served.url, default_max_tokens=1024, max_tokens_cap=8192) as proxy:
        handle = ProxyHandle.of(proxy)
        for gold in (True, False):
            engine.set_tasks([task], gold=gold)
            start = len(engine.calls)
            res = stack.run(task, handle)
            label = "gold" if gold else "empty"
            want = 1.0 if gold else 0.0
            h, meta = res.harness, res.trajectory.metadata
            report.harness[label] = {"reason": res.reason, "exit_code": h.exit_code if h else None,
                                     "stdout_tail": meta.get("harness_stdout_tail", ""),
                                     "stderr_tail": meta.get("harness_stderr_tail", ""), "ending": meta.get("ending")}
            why = _episode_detail(res)
            report.add(f"{label}: ends with a reason", res.trajectory.termination == res.reason and bool(res.reason),
                       f"{res.reason} ({res.status}) {res.error}".strip() + why)
            ok = res.status == "ok" and res.trajectory.reward == want
            report.add(f"{label}: reward {want}", ok,
                       f"reward {res.trajectory.reward}, harness {h.reason if h else None}" + ("" if ok else why))
            problems = token_exact_problems(res.trajectory, engine.calls[start:])
            report.add(f"{label}: token-exact record", not problems,
                       "; ".join(problems) + (why if problems else "") or f"{len(res.trajectory.calls)} calls")
            if gold:
                _fits(report, res.trajectory, context, model)
                # why the scripted policy could not act, in its own words (a reward-0 gold run
                # otherwise only says the tests failed)
                report.add("gold: the scripted policy found a shell tool", not engine.policy.problems,
                           "; ".join(engine.policy.problems) or "yes")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="harnessrl check-adapter", description=__doc__.splitlines()[0])
    ap.add_argument("adapter", help="registry name, package.module:Class, or a .toml/.yaml command config")
    ap.add_argument("--backend", default="auto", help="sandbox backend: auto, docker or local")
    ap.add_argument("--wall-time", type=float, default=300.0, help="harness wall-clock limit per episode (s)")
    ap.add_argument("--model", default="smollm2-135m", help="the model to be trained: its context bounds the prompt")
    ap.add_argument("--context-length", type=int, default=None,
                    help="the serving engine's context (default: --model's)")
    ap.add_argument("--suite", default="builtin", help="where the gold task comes from: a suite name, a task file or a "
                                                       "folder of Harbor tasks (its solution/solve.sh)")
    args = ap.parse_args(argv)
    report = check_adapter(args.adapter, args.backend, args.wall_time, args.model, args.context_length, args.suite)
    for c in report.checks:
        print(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    print(json.dumps({"adapter": report.adapter, "ok": report.ok, "checks": [asdict(c) for c in report.checks],
                      "harness": report.harness}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
