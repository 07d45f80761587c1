"""The report of a training run, and runs side by side (`harnessrl compare`).

Contract: `RunFigures` takes each consumed batch (`add`) and keeps only numbers, so a long
run holds no trajectories: per-turn env latencies, model-call latencies, generation spans.
`report(...)` gives the run's figures: trajectories/s with the staleness bound η and its
policy beside it, the staleness histogram of trained tokens, per-turn env latency
p50/p95/p99, sandbox acquisition (any wait included) and pool reset p50/p95 per episode,
generator utilization, the scheduler's counts, and the cheat rate ("cheat": tampered episodes
by kind and the canary pass rate with its k/n, `gym.cheat`). `train()` writes it to
`report.json`. `compare(run_dirs)` reads those reports and puts the runs side by side, each
with its throughput ratio against the η = 0 (synchronous) run among them when there is one,
and names the config fields, other than the staleness settings, in which the runs differ
(a ratio between runs that differ elsewhere measures more than staleness).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.gym.cheat import CheatTally
from harnessrl.gym.cheat import summary_line as cheat_line
from harnessrl.gym.rollout import busy_fraction, generation_spans, percentile, sandbox_timings
from harnessrl.gym.trajectory import Trajectory

#: Config fields a comparison of staleness settings may differ in (and the run's folder).
STALENESS_FIELDS = {"out_dir", "scheduler.staleness", "scheduler.over_staleness", "scheduler.downweight_factor",
                    "scheduler.max_wait_s", "scheduler.admission_slack"}


class RunFigures:
    def __init__(self) -> None:
        self.trajectories = 0
        self.rewards: list[float] = []
        self.env: list[float] = []
        self.calls: list[float] = []
        self.spans: list[tuple[float, float]] = []
        self.sandbox_acquire: list[float] = []
        self.sandbox_reset: list[float] = []
        self.cheat = CheatTally()

    def add(self, batch: list[Trajectory]) -> None:
        self.trajectories += len(batch)
        self.rewards += [float(t.reward) for t in batch if t.reward is not None and t.status != "infra_error"]
        for t in batch:
            self.env += [c.env_s for c in t.calls if c.env_s is not None]
            self.calls += [c.queue_s + c.gen_s for c in t.calls]
        self.spans += generation_spans(batch)
        acquire, reset = sandbox_timings(batch)
        self.sandbox_acquire += acquire
        self.sandbox_reset += reset
        self.cheat.add(batch)

    def report(self, *, wall_s: float, steps: int, staleness: int, over_staleness: str,
               scheduler: dict[str, Any]) -> dict[str, Any]:
        tps = self.trajectories / wall_s if wall_s > 0 else None
        return {
            "steps": steps, "trajectories": self.trajectories, "wall_s": round(wall_s, 2),
            "trajectories_per_s": None if tps is None else round(tps, 4),
            "staleness_bound": staleness, "over_staleness": over_staleness,
            "staleness_hist": {int(k): v for k, v in sorted(scheduler.get("staleness_hist", {}).items())},
            "reward_mean": sum(self.rewards) / len(self.rewards) if self.rewards else None,
            "env_latency_s": {"p50": percentile(self.env, .5), "p95": percentile(self.env, .95),
                              "p99": percentile(self.env, .99), "n": len(self.env)},
            "model_call_latency_s": {"p50": percentile(self.calls, .5), "p95": percentile(self.calls, .95),
                                     "n": len(self.calls)},
            "sandbox_acquire_s": {"p50": percentile(self.sandbox_acquire, .5),
                                  "p95": percentile(self.sandbox_acquire, .95), "n": len(self.sandbox_acquire)},
            "sandbox_reset_s": {"p50": percentile(self.sandbox_reset, .5), "p95": percentile(self.sandbox_reset, .95),
                                "n": len(self.sandbox_reset)},
            "generator_utilization": busy_fraction(self.spans),
            "scheduler": {k: scheduler[k] for k in ("started", "completed", "timeouts", "requeued_turn",
                                                    "requeued_group", "dropped", "downweighted", "masked_tokens",
                                                    "trained_tokens", "waited_groups", "wait_s", "wait_timeouts")
                          if k in scheduler},
            "cheat": self.cheat.as_dict(),
        }


def summary_line(r: dict[str, Any]) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    env = r["env_latency_s"]
    sb = r.get("sandbox_acquire_s") or {}
    reset = r.get("sandbox_reset_s") or {}
    return (f"run: {r['trajectories']} trajectories in {r['wall_s']:.0f}s = {f(r['trajectories_per_s'])} traj/s "
            f"at staleness bound η={r['staleness_bound']} ({r['over_staleness']}); staleness hist {r['staleness_hist']}; "
            f"env latency p50 {f(env['p50'])}s p95 {f(env['p95'])}s; sandbox acquire p50 {f(sb.get('p50'))}s "
            f"p95 {f(sb.get('p95'))}s, reset p50 {f(reset.get('p50'))}s p95 {f(reset.get('p95'))}s; generator utilization {f(r['generator_utilization'], '.2f')}"
            + (f"\n{cheat_line(r['cheat'])}" if r.get("cheat") else ""))


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare(run_dirs: list[str | Path]) -> dict[str, Any]:
    """Runs side by side; raises FileNotFoundError naming a folder without report.json."""
    runs = []
    for d in map(Path, run_dirs):
        rep = d / "report.json"
        if not rep.exists():
            raise FileNotFoundError(f"{d}: no report.json (a finished `harnessrl train` run writes one)")
        cfg = d / "config.json"
        runs.append({"run": str(d), "report": json.loads(rep.read_text()),
                     "config": _flat(json.loads(cfg.read_text())) if cfg.exists() else {}})
    sync = next((r for r in runs if r["report"]["staleness_bound"] == 0), None)
    base = sync["report"]["trajectories_per_s"] if sync else None
    keys = set().union(*(r["config"] for r in runs)) - STALENESS_FIELDS
    differ = sorted(k for k in keys if len({json.dumps(r["config"].get(k), sort_keys=True) for r in runs}) > 1)
    rows = []
    for r in runs:
        rep = r["report"]
        tps = rep["trajectories_per_s"]
        rows.append({"run": r["run"], "staleness_bound": rep["staleness_bound"], "over_staleness": rep["over_staleness"],
                     "trajectories_per_s": tps,
                     "ratio_vs_sync": round(tps / base, 3) if base and tps is not None else None,
                     "generator_utilization": rep["generator_utilization"],
                     "env_latency_p95_s": rep["env_latency_s"]["p95"],
                     "max_lag": max((int(k) for k in rep["staleness_hist"]), default=None)})
    return {"rows": rows, "sync_run": sync["run"] if sync else None, "config_differs_in": differ}
