"""Rollout throughput per harness with the scripted policy: concurrency 1 vs 8, one run.

For each installed harness, runs `--episodes` episodes of a built-in task (gold plan, so
every episode is a full, successful one) in real Docker sandboxes through the real proxy,
with the scripted engine (instant answers, real tokenizer ids) behind it, first one at a
time, then `--concurrency` at a time. Prints episodes/hour at both and their ratio, the
success rate, and the per-call time spent in the proxy (queue + generation round trip to
the instant engine, from the proxy's own records: the proxy's overhead per call).

Issue 5 sets no numeric target for this bench: `target_met` is true when every measured
harness ran all its episodes to reward 1.0 at both concurrencies (the throughput figures
are reported, not judged). The last stdout line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def _p(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4) if xs else None


def run_harness(stack, proxy, task, episodes: int, concurrency: int) -> dict:
    from harnessrl.gym.episode import ProxyHandle

    handle = ProxyHandle.of(proxy)

    def one(_: int):
        return stack.run(task, handle)

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(episodes)))
    wall = time.monotonic() - t0
    calls = [c for r in results for c in r.trajectory.calls]
    return {"episodes": episodes, "concurrency": concurrency, "wall_s": round(wall, 2),
            "episodes_per_hour": round(episodes * 3600 / wall, 1),
            "success": sum(r.trajectory.reward == 1.0 for r in results),
            "endings": dict(__import__("collections").Counter(r.reason for r in results)),
            "calls_per_episode": round(len(calls) / episodes, 2),
            "proxy_call_s_p50": _p([c.queue_s + c.gen_s for c in calls], 0.5),
            "proxy_call_s_p95": _p([c.queue_s + c.gen_s for c in calls], 0.95),
            "episode_s_mean": round(statistics.fmean(sum(r.timings.values()) for r in results), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harnesses", default="mini-swe-agent,codex,claude-code,opencode,aider")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--task", default=None, help="built-in instance id (default: the first trivial task)")
    args = ap.parse_args()

    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.stack import EpisodeStack, proxy_config
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.sandboxes.docker import DockerBackend

    tasks = load_suite("builtin")
    task = next(t for t in tasks if (t.instance_id == args.task if args.task else t.difficulty == "trivial"))
    backend = DockerBackend()
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    out: dict[str, dict] = {}
    run = RolloutConfig(model="tiny-llama", sandbox_pool_size=0, episode=EpisodeConfig(max_calls=12, wall_time_s=300))
    with ServedApp(engine.app()) as served, \
            ProxyServer(proxy_config(run, served.url, default_max_tokens=1024, max_tokens_cap=8192)) as proxy:
        for name in args.harnesses.split(","):  # one proxy, a stack per harness
            stack = EpisodeStack(run.model_copy(update={"harness": name}), tasks=[task], sandbox_backend=backend)
            adapter = stack.adapter
            kind = "npm" if adapter.install.startswith("npm:") else "venvs"
            if installed_spec(kind, name) != adapter.install.split(":", 1)[1]:
                print(f"{name}: not installed, skipped (scripts/install_harnesses.sh {name})", file=sys.stderr)
                continue
            seq = run_harness(stack, proxy, task, args.episodes, 1)
            par = run_harness(stack, proxy, task, args.episodes, args.concurrency)
            ratio = par["episodes_per_hour"] / seq["episodes_per_hour"]
            out[name] = {"c1": seq, f"c{args.concurrency}": par, "ratio": round(ratio, 2)}
            print(f"{name:<15} c1 {seq['episodes_per_hour']:>7.1f} ep/h   c{args.concurrency} "
                  f"{par['episodes_per_hour']:>7.1f} ep/h   x{ratio:.2f}   success {seq['success']}/{args.episodes}, "
                  f"{par['success']}/{args.episodes}   proxy per call p50 {seq['proxy_call_s_p50']}s "
                  f"p95 {seq['proxy_call_s_p95']}s   calls/ep {seq['calls_per_episode']}")
    backend.reap(run_id=backend.run_id)
    ok = bool(out) and all(v["c1"]["success"] == args.episodes and v[f"c{args.concurrency}"]["success"] == args.episodes
                           for v in out.values())
    print(json.dumps({"bench": "rollout_throughput", "task": task.instance_id, "harnesses": out, "target_met": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
