"""Calls/s of one run's proxies: 1 proxy process against 2 (`rollout.proxies`), side by side in one run.

    .venv/bin/python bench/proxy_scaleout.py [--sessions 64] [--calls 2000] [--rounds 3]

Each round starts the instant stand-in engine once, then for k = 1 and k = 2 proxy processes
(each `python -m harnessrl.gym.proxy` with its own SQLite store, as a run's extra proxies are)
opens `--sessions` sessions spread round-robin over the k proxies and sends `--calls` chat
calls (the ~6 kB harness-shaped first request of `bench/proxy_overhead.py`) over one
keep-alive connection per session. Reported per k: calls/s (wall), p50/p99 latency, CPU ms per
call summed over the proxy processes (schedstat), and the median over rounds; the ratio
calls/s(2) / calls/s(1). The load generator and the engine share the machine's cores with the
proxies: on a machine with few cores the ratio is bounded by what is left for the second proxy.
Ends with one JSON line; `target_met`: two proxies serve at least 1.3x the calls/s of one (a
bar a 2-core machine that also runs the load and the engine can clear; more cores, more).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (MSGS, PY, ROOT, cpu_s, free_port, run_load_on, sessions, start_proxy,  # noqa: E402
                            wait_http)


async def load(targets: list[tuple[int, str, str]], n: int, body: bytes) -> dict:
    """n calls over one connection per target (port, path, header lines); latency per call."""
    res = await run_load_on(targets, n, len(targets), body)
    return {k: res[k] for k in ("calls_per_s", "p50_ms", "p99_ms")}


def one(eport: int, k: int, n_sessions: int, n: int, tmp: Path) -> dict:
    token = "bench-admin"
    procs = [start_proxy(eport, tmp, token) for _ in range(k)]
    try:
        targets = []
        for i in range(n_sessions):
            proc, port = procs[i % k]
            (sid, hdr), = sessions(port, token, 1)
            targets.append((port, f"/s/{sid}/v1/chat/completions", hdr))
        body = json.dumps({"model": "policy", "messages": MSGS}).encode()
        asyncio.run(load(targets, min(n, 4 * n_sessions), body))  # warm-up: every session once or more
        c0 = sum(cpu_s(p.pid) for p, _ in procs)
        res = asyncio.run(load(targets, n, body))
        res["proxy_cpu_ms_per_call"] = round((sum(cpu_s(p.pid) for p, _ in procs) - c0) * 1e3 / n, 3)
        return res
    finally:
        for p, _ in procs:
            p.terminate()
            p.wait(15)
            p.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="proxy-scaleout-"))
    engine = subprocess.Popen([PY, "-m", "harnessrl.gym.doubles.standin", "--port", str(eport := free_port())],
                              cwd=ROOT)
    try:
        wait_http(eport, "/health", 60)
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for r in range(a.rounds):
            for k in (1, 2):  # alternated, so a load that comes and goes falls on both alike
                runs[k].append(one(eport, k, a.sessions, a.calls, tmp))
                print(f"round {r} proxies {k}: {runs[k][-1]}", file=sys.stderr)
        med = {k: sorted(v, key=lambda x: x["calls_per_s"])[len(v) // 2] for k, v in runs.items()}
        ratio = round(med[2]["calls_per_s"] / med[1]["calls_per_s"], 3)
        print(json.dumps({"bench": "proxy_scaleout", "sessions": a.sessions, "calls": a.calls, "rounds": a.rounds,
                          "cores": os.cpu_count(), "median": {str(k): v for k, v in med.items()},
                          "rounds_calls_per_s": {str(k): [x["calls_per_s"] for x in v] for k, v in runs.items()},
                          "ratio_2_over_1": ratio, "targets": {"ratio_2_over_1>=1.3": ratio >= 1.3},
                          "target_met": ratio >= 1.3}))
        return 0
    finally:
        engine.terminate()
        engine.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
