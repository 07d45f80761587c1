"""Three engines side by side in one run: sticky routing against call-by-call round robin, and a
weight sync to three engines at once against one.

1. Prefix-cache locality: `--sessions` agent-like conversations of `--turns` turns (each turn
   the previous prompt + the 16-token greedy reply + `--grow` new tokens, every session with
   its own opening), sent one call at a time to three local engines (`python -m
   harnessrl.trainers.engine`, each its own process): through `RoutedBackend` (each session
   sticks to one engine), then, after every engine's cache is flushed, round robin (call k of
   session s on engine (s + k) % 3). Reported: the share of prompt tokens the engines served
   from their prefix cache (`cached_tokens`), and the wall time of all calls.
   Each engine answers one call first, so neither run pays the cold start.
2. Fan-out: `/update_weights_from_disk` inside pause/continue (`DiskWeightSync.load`), on one
   engine (an `EngineClient`), on the three one after another, and on all three at once (an
   `EngineFleet`), `--syncs` times each, interleaved; median seconds.
Target: sticky routing serves more of the prompt from cache than round robin. The sync figures
are reported, not targeted: a load into the local CPU engine is CPU-bound, so on a small
machine three at once share its cores and take about as long as three one after another; the
fan-out pays off where engines load on their own hosts or GPUs, and what it guarantees (a slow
or stopped engine holds no other) is tested in tests/test_engines_many.py. The last stdout
line is one JSON object with `target_met`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx


def _spawn(model: str) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl.trainers.engine", "--model", model, "--port",
                             str(port), "--weight-version", "0", "--num-threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f"http://127.0.0.1:{port}", proc


def _ready(url: str, proc: subprocess.Popen) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"engine at {url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


async def _conversations(backend_for, sessions: int, turns: int, grow: int) -> tuple[int, int, float]:
    """(prompt tokens, cached tokens, seconds) over every call; `backend_for(s, k)` gives the
    backend of call k of session s, with `SESSION` set where it routes by it."""
    prompts = [[1000 + s] * 64 for s in range(sessions)]  # each session's own opening
    total = cached = 0
    t0 = time.perf_counter()
    for k in range(turns):
        for s in range(sessions):
            r = await backend_for(s, k).generate(prompts[s], max_new_tokens=16, temperature=0.0)
            total += len(prompts[s])
            cached += r.cached_tokens
            prompts[s] = prompts[s] + r.output_ids + [(7 * s + k + j) % 5000 + 100 for j in range(grow)]
    return total, cached, time.perf_counter() - t0


async def run(a: argparse.Namespace) -> dict:
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.backends.fleet import EngineFleet
    from harnessrl.gym.backends.protocol import SESSION
    from harnessrl.gym.backends.router import RoutedBackend
    from harnessrl.gym.models import resolve_model
    from harnessrl.trainers.weight_sync import DiskWeightSync

    spawned = [_spawn(a.model) for _ in range(3)]
    try:
        for url, proc in spawned:
            _ready(url, proc)
        urls = [u for u, _ in spawned]
        clients = [EngineClient(u) for u in urls]
        router = RoutedBackend([EngineClient(u) for u in urls])

        def sticky(s: int, k: int):
            SESSION.set(f"s{s}")
            return router

        for c in clients:  # the cold start (first allocations) paid before either run
            await c.generate([5] * 32, max_new_tokens=4, temperature=0.0)
        await asyncio.gather(*(c.flush_cache() for c in clients))
        sticky_run = await _conversations(sticky, a.sessions, a.turns, a.grow)
        await asyncio.gather(*(c.flush_cache() for c in clients))
        rr_run = await _conversations(lambda s, k: clients[(s + k) % 3], a.sessions, a.turns, a.grow)

        folder = str(resolve_model(a.model))
        fleet = EngineFleet(urls)
        one, serial, three = [], [], []
        for i in range(a.syncs):
            t0 = time.perf_counter()
            await DiskWeightSync(clients[0], "unused").load(folder, 3 * i + 1)
            one.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for c in clients:
                await DiskWeightSync(c, "unused").load(folder, 3 * i + 2)
            serial.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await DiskWeightSync(fleet, "unused").load(folder, 3 * i + 3)
            three.append(time.perf_counter() - t0)
        assert fleet.behind() == [] and fleet.version == 3 * a.syncs
        for c in clients:
            await c.aclose()
        await router.aclose()
        await fleet.aclose()
    finally:
        for _, proc in spawned:
            proc.kill()
            proc.wait()
    hit_sticky, hit_rr = sticky_run[1] / sticky_run[0], rr_run[1] / rr_run[0]
    s1, s_serial, s3 = statistics.median(one), statistics.median(serial), statistics.median(three)
    return {"model": a.model, "sessions": a.sessions, "turns": a.turns, "prompt_tokens": sticky_run[0],
            "cache_hit_sticky": round(hit_sticky, 3), "cache_hit_round_robin": round(hit_rr, 3),
            "calls_s_sticky": round(sticky_run[2], 2), "calls_s_round_robin": round(rr_run[2], 2),
            "sync_s_one_engine": round(s1, 3), "sync_s_three_one_by_one": round(s_serial, 3),
            "sync_s_three_at_once": round(s3, 3), "fanout_speedup": round(s_serial / s3, 2),
            "target_met": hit_sticky > hit_rr}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--grow", type=int, default=200, help="new prompt tokens per turn (the observation)")
    p.add_argument("--syncs", type=int, default=3)
    out = asyncio.run(run(p.parse_args()))
    print(f"prefix cache hit: sticky {out['cache_hit_sticky']:.1%} vs round robin {out['cache_hit_round_robin']:.1%} "
          f"({out['calls_s_sticky']} s vs {out['calls_s_round_robin']} s for {out['prompt_tokens']} prompt tokens)")
    print(f"weight sync: one engine {out['sync_s_one_engine']} s; three one by one {out['sync_s_three_one_by_one']} s, "
          f"at once {out['sync_s_three_at_once']} s ({out['fanout_speedup']}x)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
