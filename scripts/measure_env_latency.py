"""Measure per-turn environment latency on the built-in suite, for bench/async_vs_sync.py
(`python scripts/measure_env_latency.py`).

A coding agent's turn in the environment is a shell command in its sandbox: look around
(`ls`, `cat`, `grep`), edit (the task's gold plan steps), and run the tests. For each
built-in task this runs such a turn sequence in a real sandbox (Docker by default) and
records each command's wall time, in seconds, to bench/data/builtin_env_latency.json.
The last stdout line is one JSON object with the distribution's summary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def turns_for(task) -> list[str]:
    tests = " ".join(sorted({t.split("::")[0] for t in task.PASS_TO_PASS + task.FAIL_TO_PASS})) or "."
    return (["ls -la", "git status --short", "grep -rn 'def ' --include=*.py . | head -50",
             f"cat {tests.split()[0]} | head -80"] + list(task.gold_plan)
            + [f"python3 -m pytest -q -x -p no:cacheprovider {tests}", "git diff"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="docker")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "bench" / "data" / "builtin_env_latency.json")
    ap.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    args = ap.parse_args()

    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.sandboxes import make_backend

    tasks = load_suite("builtin")[: args.limit]
    backend = make_backend(args.backend)
    samples: list[float] = []
    by_repo: dict[str, object] = {}
    try:
        for task in tasks:
            sb = by_repo.get(task.repo)
            if sb is None:
                sb = by_repo[task.repo] = backend.create(task.repo_spec())
            else:
                sb.reset()
            for cmd in turns_for(task):
                t0 = time.monotonic()
                sb.exec(cmd, timeout=120)
                samples.append(round(time.monotonic() - t0, 4))
    finally:
        for sb in by_repo.values():
            sb.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(samples))
    xs = sorted(samples)
    summary = {"bench": "measure_env_latency", "backend": args.backend, "n": len(xs),
               "mean_s": round(statistics.fmean(xs), 4), "p50_s": xs[len(xs) // 2],
               "p95_s": xs[int(0.95 * len(xs))], "max_s": xs[-1],
               "cv": round(statistics.pstdev(xs) / statistics.fmean(xs), 3), "out": str(args.out)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
