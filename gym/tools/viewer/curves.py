"""The run-level figures the runs page draws, computed server-side and bounded in size.

Contract: `summary(index)` returns the run's reward curve and success rate (per trainer step
from `metrics.jsonl` for a train run; per episode in recording order, as a running mean over
a window, for a rollout), the staleness histogram (sampled tokens per policy-version lag, from
`report.json`, else summed over the steps), histograms of per-call env latency and model-call
latency (queue + generation; binned in SQL over every call of the store, so a run of any size
sends a fixed number of bins), episode counts by status, the run report itself, and the cheat
rate (`cheat`: per step the tampered fraction and the canary pass rate from `metrics.jsonl`;
the totals, tampered episodes by kind and canaries passed k/n, from the report's "cheat"
section, else summed over the steps: `gym.cheat`). A curve
longer than `max_points` is thinned to that many evenly spaced points (the last one kept).
"""
from __future__ import annotations

import json
import math
from typing import Any

from harnessrl.gym.cheat import from_steps
from harnessrl.gym.tools.viewer.run_index import RunIndex


def _thin(points: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    if len(points) <= max_points:
        return points
    step = (len(points) - 1) / (max_points - 1)
    return [points[round(i * step)] for i in range(max_points)]


def _read_jsonl(path) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line being written by a live run
                    continue
    return out


def reward_curve(index: RunIndex, max_points: int = 500) -> dict[str, Any]:
    """{"x": "step"|"episode", "points": [{x, reward, success}]} (module doc)."""
    if index.files.metrics is not None:
        pts = [{"x": m.get("step", i), "reward": m.get("reward_mean"), "success": m.get("success_rate"),
                "version": m.get("version")} for i, m in enumerate(_read_jsonl(index.files.metrics))]
        pts = [p for p in pts if p["reward"] is not None]
        if pts:
            return {"x": "step", "points": _thin(pts, max_points)}
    rewards = [r[0] for r in index.query("SELECT reward FROM episodes WHERE reward IS NOT NULL ORDER BY ord")]
    window = max(1, len(rewards) // 50)
    pts, acc, wins = [], 0.0, 0
    for i, r in enumerate(rewards):
        acc += r
        wins += r >= 1.0
        if i >= window:
            acc -= rewards[i - window]
            wins -= rewards[i - window] >= 1.0
        n = min(i + 1, window)
        pts.append({"x": i + 1, "reward": acc / n, "success": wins / n})
    return {"x": "episode", "window": window, "points": _thin(pts, max_points)}


def histogram(index: RunIndex, expr: str, where: str, bins: int = 30) -> dict[str, Any]:
    """Counts of `expr` over the calls table in `bins` equal bins, with p50/p95 and n."""
    lo, hi, n = index.query(f"SELECT MIN({expr}), MAX({expr}), COUNT(*) FROM calls WHERE {where}")[0]
    if not n:
        return {"n": 0, "lo": None, "hi": None, "counts": [], "p50": None, "p95": None}
    width = (hi - lo) / bins if hi > lo else 1.0
    rows = index.query(f"SELECT MIN(CAST(({expr} - ?) / ? AS INTEGER), ?), COUNT(*) FROM calls WHERE {where} "
                       "GROUP BY 1", (lo, width, bins - 1))
    counts = [0] * (bins if hi > lo else 1)
    for b, c in rows:
        counts[min(b, len(counts) - 1)] += c

    def pct(q: float) -> float:
        k = min(n - 1, max(0, math.ceil(q * n) - 1))
        return index.query(f"SELECT {expr} FROM calls WHERE {where} ORDER BY 1 LIMIT 1 OFFSET ?", (k,))[0][0]

    return {"n": n, "lo": lo, "hi": hi if hi > lo else lo + width, "counts": counts, "p50": pct(0.5), "p95": pct(0.95)}


def staleness(index: RunIndex, report: dict[str, Any] | None) -> dict[str, int]:
    if report and isinstance(report.get("staleness_hist"), dict):
        return {str(k): int(v) for k, v in report["staleness_hist"].items()}
    out: dict[str, int] = {}
    if index.files.metrics is not None:
        for m in _read_jsonl(index.files.metrics):
            for k, v in ((m.get("scheduler") or {}).get("staleness_hist") or {}).items():
                out[str(k)] = out.get(str(k), 0) + int(v)
    return out


def cheat(index: RunIndex, report: dict[str, Any] | None, max_points: int = 500) -> dict[str, Any]:
    """{"points": [{x, tampered_frac, canary_pass_rate, canary_episodes}] per step, "totals"} (module doc)."""
    steps = _read_jsonl(index.files.metrics) if index.files.metrics is not None else []
    pts = [{"x": m.get("step", i), "tampered_frac": m.get("tampered_frac"),
            "canary_pass_rate": m.get("canary_pass_rate"), "canary_episodes": m.get("canary_episodes", 0)}
           for i, m in enumerate(steps) if "tampered_episodes" in m]
    totals = report.get("cheat") if report and isinstance(report.get("cheat"), dict) else from_steps(steps)
    return {"points": _thin(pts, max_points), "totals": totals}


def by_harness(index: RunIndex) -> list[dict[str, Any]]:
    """Each harness's episodes, scored episodes, success rate and mean reward over the scored
    (reward set), sampled tokens, infrastructure failures (masked) and harness crashes."""
    rows = index.query(
        "SELECT harness, COUNT(*), COUNT(reward), SUM(reward >= 1.0), AVG(reward), SUM(sampled), "
        "SUM(status = 'infra_error'), SUM(termination = 'harness_crashed') FROM episodes GROUP BY harness "
        "ORDER BY harness")
    return [{"harness": h, "episodes": n, "scored": k, "success_rate": (ok or 0) / k if k else None,
             "reward_mean": mean, "sampled_tokens": tok or 0, "infra_errors": infra or 0, "harness_crashed": crashed or 0}
            for h, n, k, ok, mean, tok, infra, crashed in rows]


def summary(index: RunIndex, max_points: int = 500) -> dict[str, Any]:
    report = None
    if index.files.report is not None:
        try:
            report = json.loads(index.files.report.read_text())
        except ValueError:
            report = None
    counts = dict(index.query("SELECT status, COUNT(*) FROM episodes GROUP BY status ORDER BY status"))
    scored = index.query("SELECT COUNT(*), SUM(reward >= 1.0), AVG(reward) FROM episodes WHERE reward IS NOT NULL")[0]
    return {
        "name": index.name, "root": str(index.files.root), "kind": "train" if index.files.metrics else "rollout",
        "episodes": sum(counts.values()), "by_status": counts, "scored": scored[0],
        "success_rate": (scored[1] / scored[0]) if scored[0] else None, "reward_mean": scored[2],
        "by_harness": by_harness(index),
        "curve": reward_curve(index, max_points),
        "staleness_hist": staleness(index, report),
        "env_latency_s": histogram(index, "env_s", "env_s IS NOT NULL"),
        "model_call_latency_s": histogram(index, "model_s", "detached = 0"),
        "report": report,
        "cheat": cheat(index, report, max_points),
    }
