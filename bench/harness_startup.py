"""What a beside Python harness costs the machine before it does anything, plain vs pre-forked.

Side by side, in one run, interleaved: the real harness (mini-swe-agent by default; `--harness
aider` too) runs the built-in task's gold plan through the real proxy and a scripted engine
(tiny-llama's tokenizer, so generation costs ~nothing) in Docker sandboxes, launched plainly
(HARNESSRL_PREFORK=0) and from its warm fork server (adapters/prefork.py), N episodes each.
Per episode: wall time to its first model call, the harness's run time, the episode's wall
time, and the machine's CPU core-seconds over the episode (from /proc/stat, so the harness,
its server, Docker and the proxy all count; the machine should be otherwise quiet). The first
forked episode (which waits for the server to import its preload) is reported apart, and the
forked episodes' medians exclude it.

Both launches must agree exactly: reward 1.0, the same recorded prompt and completion token
ids on every call. Target: the median CPU per episode forked <= 0.5x plain, with identical
records. The last stdout line is one JSON object.

Usage: .venv/bin/python bench/harness_startup.py [--episodes 5] [--harness mini-swe-agent]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _busy_s() -> float:
    with open("/proc/stat") as f:
        v = [float(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=5, help="episodes per launch mode")
    ap.add_argument("--harness", default="mini-swe-agent")
    args = ap.parse_args()

    from harnessrl.adapters import prefork
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.stack import EpisodeStack
    from harnessrl.gym.tasks.suites.builtin import load
    from harnessrl.sandboxes.docker import DockerBackend

    task = next(t for t in load() if t.gold_plan)
    stack = EpisodeStack(RolloutConfig(harness=args.harness, model="tiny-llama", sandbox_pool_size=0,
                                       episode=EpisodeConfig(max_calls=8, wall_time_s=240)),
                         tasks=[task], sandbox_backend=DockerBackend())
    backend = stack.backend
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    rows: dict[str, list[dict]] = {"plain": [], "forked": []}
    records: dict[str, set] = {"plain": set(), "forked": set()}
    first_forked = None
    try:
        with ServedApp(engine.app()) as served, \
                stack.proxy(served.url, default_max_tokens=1024, max_tokens_cap=8192) as proxy:
            # One untimed plain episode: images, page cache and the proxy are warm for both modes.
            order = ["warm-up"] + [m for _ in range(args.episodes) for m in ("plain", "forked")] + ["forked"]
            for mode in order:
                os.environ["HARNESSRL_PREFORK"] = "1" if mode == "forked" else "0"
                cpu0, t0 = _busy_s(), time.time()
                res = stack.run(task, ProxyHandle.of(proxy))
                wall, cpu = time.time() - t0, _busy_s() - cpu0
                calls = res.trajectory.calls
                first = calls[0].finished_at - calls[0].gen_s - calls[0].queue_s - t0 if calls else None
                launch = res.harness.details.get("launch", "plain")
                row = {"wall_s": round(wall, 2), "cpu_core_s": round(cpu, 2), "harness_s": round(res.harness.duration_s, 2),
                       "first_call_s": None if first is None else round(first, 2), "reward": res.trajectory.reward,
                       "launch": launch}
                print(mode, json.dumps(row), flush=True)
                if mode == "warm-up":
                    continue
                if (mode == "forked") != (launch == "forked"):
                    raise SystemExit(f"{mode} episode launched {launch!r}")
                records[mode].add(tuple((tuple(c.prompt_ids), tuple(c.completion_ids)) for c in calls))
                if mode == "forked" and first_forked is None:
                    first_forked = row
                else:
                    rows[mode].append(row)
    finally:
        prefork.close_all()
        backend.reap(run_id=backend.run_id)

    def med(mode: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rows[mode]), 2)

    fig = {m: {k: med(m, k) for k in ("wall_s", "cpu_core_s", "harness_s", "first_call_s")} for m in rows}
    same = len(records["plain"]) == 1 and records["plain"] == records["forked"]
    rewards = {r["reward"] for m in rows for r in rows[m]} | {first_forked["reward"]}
    cpu_ratio = round(fig["forked"]["cpu_core_s"] / fig["plain"]["cpu_core_s"], 3)
    print(f"\n{'':8}{'wall s':>9}{'cpu core-s':>12}{'harness s':>11}{'1st call s':>12}   (medians, {args.episodes} each)")
    for m in ("plain", "forked"):
        print(f"{m:8}" + "".join(f"{fig[m][k]:>{w}}" for k, w in (("wall_s", 9), ("cpu_core_s", 12), ("harness_s", 11),
                                                                 ("first_call_s", 12))))
    print(f"first forked episode (server start-up): {first_forked}")
    print(f"forked / plain: cpu {cpu_ratio}x, first call {fig['forked']['first_call_s'] / fig['plain']['first_call_s']:.3f}x; "
          f"records identical: {same}; rewards {sorted(rewards)}")
    print(json.dumps({"bench": "harness_startup", "harness": args.harness, "episodes": args.episodes, **fig,
                      "first_forked": first_forked, "cpu_ratio": cpu_ratio,
                      "first_call_ratio": round(fig["forked"]["first_call_s"] / fig["plain"]["first_call_s"], 3),
                      "records_identical": same, "rewards": sorted(rewards), "load_avg": os.getloadavg()[0],
                      "target_met": bool(same and rewards == {1.0} and cpu_ratio <= 0.5)}))


if __name__ == "__main__":
    main()
