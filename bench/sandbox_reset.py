"""How fast does a new episode get a clean repository at its base commit?

Side by side, in one run, on one generated repository (300 files, 5 commits; the task image
is built before timing starts), over N episodes each; every episode first dirties the repo
(edits a tracked file, adds files, commits, writes /tmp), untimed:

  warm    docker SandboxPool: release (reset) + acquire of the same warm container
  fresh   docker: create + start a new container from the cached image (close untimed)
  local   bubblewrap SandboxPool: release (reset) + acquire
  local-fresh  bubblewrap: create a new sandbox from the cached checkout

Prints p50/p95 per mode and ratios, then ONE JSON line. Target: warm p50 <= 150 ms and
>= 7x faster than fresh. Usage: python bench/sandbox_reset.py [--episodes 50]

`--mode train`: the same question inside `harnessrl train` itself (trainers.loop.train: the
local engine with tiny-llama, the real mini-swe-agent, docker sandboxes, the built-in trivial
tasks), run twice side by side, `rollout.sandbox_pool_size` 2 (pooled) vs 0 (fresh), and read
from each run's report.json: sandbox acquisition per episode (any wait for a sandbox being
started included) and the pool's reset on release, p50/p95. Target: pooled acquisition p50
<= 150 ms. Usage: python bench/sandbox_reset.py --mode train [--steps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harnessrl.sandboxes import RepoSpec, SandboxPool, SandboxUnavailable, make_backend
from harnessrl.sandboxes.pool import PoolConfig


def make_repo(root: Path) -> tuple[str, str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    run = lambda *a: subprocess.run(["git", *a], cwd=root, env=env, check=True, capture_output=True,
                                    text=True).stdout.strip()
    run("init", "-q", "-b", "main")
    for commit in range(5):
        for i in range(300):
            f = root / f"pkg{i % 20}" / f"mod{i}.py"
            f.parent.mkdir(exist_ok=True)
            f.write_text("".join(f"def f{j}_{commit}(x):\n    return x + {j}\n" for j in range(20)))
        run("add", "-A")
        run("commit", "-qm", f"c{commit}")
    return str(root), run("rev-parse", "HEAD")


def dirty(sb, i: int) -> None:
    sb.write_file("pkg0/mod0.py", f"broken = {i}\n".encode())
    sb.write_file(f"new_{i}/notes.txt", b"x" * 4096)
    sb.write_file("/tmp/scratch.bin", os.urandom(65536))
    sb.exec("touch untracked.txt && git add -A && git commit -qm wip")


def check_clean(sb, base: str) -> None:
    out = sb.exec("git status --porcelain; git rev-parse HEAD; ls -A /tmp").output.split()
    if out != [base]:
        raise SystemExit(f"handed a dirty repo: {out[:10]}")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_pool(backend, spec, n: int, base: str) -> list[float]:
    times = []
    with SandboxPool(backend, PoolConfig(size=1, refill=False)) as pool:
        pool.prewarm(spec)
        sb = pool.acquire(spec)
        for i in range(n):
            dirty(sb, i)
            t0 = time.perf_counter()
            pool.release(sb)
            sb = pool.acquire(spec)
            times.append(time.perf_counter() - t0)
            check_clean(sb, base)
        pool.release(sb)
    return times


def bench_fresh(backend, spec, n: int, base: str) -> list[float]:
    times = []
    backend.create(spec).close()  # image / checkout built outside the timing
    for i in range(n):
        t0 = time.perf_counter()
        sb = backend.create(spec)
        times.append(time.perf_counter() - t0)
        check_clean(sb, base)
        dirty(sb, i)
        sb.close()
    return times


def train_run(out: Path, pool_size: int, steps: int) -> dict:
    """One short `harnessrl train`; its report.json."""
    import asyncio

    from harnessrl.trainers.loop import TrainConfig, train

    cfg = TrainConfig.model_validate({
        "model": "tiny-llama", "steps": steps, "out_dir": str(out), "progress": False, "tensorboard": False,
        "stages": ["rl"], "eval": {"points": []},
        "rollout": {"max_new_tokens": 16, "sandbox": "docker", "sandbox_pool_size": pool_size,
                    "episode": {"max_calls": 2, "wall_time_s": 180}},
        "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 1},
        "trainer": {"lr": 1e-5, "device": "cpu"}})
    t0 = time.perf_counter()
    asyncio.run(train(cfg))
    rep = json.loads((out / "report.json").read_text())
    rep["run_wall_s"] = time.perf_counter() - t0
    return rep


def main_train(steps: int) -> None:
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-train-pool-") as tmp:
        for mode, size in (("pooled", 2), ("fresh", 0)):
            rep = train_run(Path(tmp) / mode, size, steps)
            acq, reset = rep["sandbox_acquire_s"], rep["sandbox_reset_s"]
            rows[mode] = {"acquire_p50_ms": acq["p50"] and 1000 * acq["p50"], "acquire_p95_ms": acq["p95"] and 1000 * acq["p95"],
                          "acquire_n": acq["n"], "reset_p50_ms": reset["p50"] and 1000 * reset["p50"],
                          "reset_p95_ms": reset["p95"] and 1000 * reset["p95"], "reset_n": reset["n"],
                          "trajectories": rep["trajectories"], "wall_s": rep["run_wall_s"]}
    f = lambda v: "-" if v is None else f"{v:8.1f}"  # noqa: E731
    for mode, r in rows.items():
        print(f"train {mode:7s} acquire p50 {f(r['acquire_p50_ms'])} ms  p95 {f(r['acquire_p95_ms'])} ms  "
              f"(n={r['acquire_n']})   reset p50 {f(r['reset_p50_ms'])} ms  p95 {f(r['reset_p95_ms'])} ms  "
              f"(n={r['reset_n']})   {r['trajectories']} trajectories in {r['wall_s']:.0f} s")
    p, fr = rows["pooled"], rows["fresh"]
    ratio = fr["acquire_p50_ms"] / p["acquire_p50_ms"] if p["acquire_p50_ms"] and fr["acquire_p50_ms"] else None
    if ratio:
        print(f"fresh_over_pooled_acquire_p50 {ratio:6.2f}x")
    print(json.dumps({"bench": "sandbox_reset", "mode": "train", "steps": steps, "cpus": os.cpu_count(),
                      "load_1m": round(os.getloadavg()[0], 2),
                      **{f"{m}_{k}": (round(v, 2) if isinstance(v, float) else v) for m, r in rows.items()
                         for k, v in r.items()},
                      "fresh_over_pooled_acquire_p50": ratio and round(ratio, 2), "target_pooled_acquire_p50_ms": 150,
                      "target_met": bool(p["acquire_p50_ms"] is not None and p["acquire_p50_ms"] <= 150.0)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--mode", choices=("reset", "train"), default="reset",
                    help="reset: pool reset+acquire vs fresh containers; train: inside harnessrl train, pooled vs fresh")
    ap.add_argument("--steps", type=int, default=3, help="train steps per run (--mode train)")
    args = ap.parse_args()
    if args.mode == "train":
        main_train(args.steps)
        return
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-reset-") as tmp:
        source, base = make_repo(Path(tmp))
        spec = RepoSpec("bench-reset", source, base)
        for name in ("docker", "local"):
            try:
                backend = make_backend(name)
            except SandboxUnavailable as e:
                print(f"{name}: unavailable ({e})", file=sys.stderr)
                continue
            modes = {"docker": [("warm", bench_pool), ("fresh", bench_fresh)],
                     "local": [("local", bench_pool), ("local-fresh", bench_fresh)]}[name]
            for mode, fn in modes:
                xs = fn(backend, spec, args.episodes, base)
                results[mode] = {"p50_ms": 1000 * statistics.median(xs), "p95_ms": 1000 * pct(xs, 0.95)}
                print(f"{mode:12s} p50 {results[mode]['p50_ms']:8.1f} ms   p95 "
                      f"{results[mode]['p95_ms']:8.1f} ms   (n={len(xs)})")
            if name == "docker":
                backend.reap(run_id=backend.run_id)
    ratios = {}
    if "warm" in results and "fresh" in results:
        ratios["fresh_over_warm_p50"] = results["fresh"]["p50_ms"] / results["warm"]["p50_ms"]
        ratios["fresh_over_warm_p95"] = results["fresh"]["p95_ms"] / results["warm"]["p95_ms"]
    if "warm" in results and "local" in results:
        ratios["local_over_warm_p50"] = results["local"]["p50_ms"] / results["warm"]["p50_ms"]
    if "local" in results and "local-fresh" in results:
        ratios["local_fresh_over_local_p50"] = results["local-fresh"]["p50_ms"] / results["local"]["p50_ms"]
    for k, v in ratios.items():
        print(f"{k:28s} {v:6.2f}x")
    met = ("warm" in results and "fresh" in results and results["warm"]["p50_ms"] <= 150.0
           and ratios["fresh_over_warm_p50"] >= 7.0)
    print(json.dumps({"bench": "sandbox_reset", "episodes": args.episodes, **{
        f"{m}_{k}": round(v, 2) for m, r in results.items() for k, v in r.items()},
        **{k: round(v, 2) for k, v in ratios.items()}, "target_warm_p50_ms": 150,
        "target_ratio": 7.0, "target_met": bool(met)}))


if __name__ == "__main__":
    main()
