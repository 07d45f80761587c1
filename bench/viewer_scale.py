"""`harnessrl view` on a large run: paged API vs shipping the whole record to the browser.

Builds a store (the proxy's real SQLite `Store`) of N episodes x C calls (~1,000 prompt tokens,
then 150 new prompt + 200 sampled tokens a call), then side by side in one run:
- the viewer: index build time, and the time and bytes of each page request (first, last and a
  sorted and a filtered page of 50 episodes, the run summary, one segment's token page), served
  over real HTTP on loopback;
- the baseline a viewer without paging would need: every trajectory read and serialized as JSONL
  (`Store.export_jsonl`), its time and bytes.
Ends with one JSON line; target: index build <= 10 s, the slowest page request <= 250 ms and each
page under 1% of the JSONL's bytes.

    .venv/bin/python bench/viewer_scale.py [--episodes 10000] [--calls 5] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import httpx

from harnessrl.gym.proxy.store import Store
from harnessrl.gym.served import ServedApp
from harnessrl.gym.tools.viewer import RunIndex
from harnessrl.gym.tools.viewer.app import build_app


def make_store(root: Path, episodes: int, calls: int) -> None:
    st = Store(root / "trajectories.db")
    rng = random.Random(0)
    for i in range(episodes):
        sid = f"s{i:06d}"
        st.open_session(sid, {"task_id": f"task-{i % 300}", "harness": "mini-swe-agent"}, "h", "tiny-llama")
        have = 0
        for k in range(calls):
            new, comp = [5] * (1000 if k == 0 else 150), [7] * 200
            st.add_call(call_id=f"{sid}-{k}", session_id=sid, idx=k, dialect="openai_chat", segment=0,
                        split_reason=None, prefix_len=have, new_prompt=new, completion=comp,
                        logprobs=[-0.3] * 200, versions=[1] * 200, finish_reason="stop", queue_s=0.01,
                        gen_s=rng.random(), env_s=None if k == 0 else rng.random(), flags={})
            have += len(new) + len(comp)
        st.set_reward(sid, float(i % 3 == 0), "ok", "submitted")
    st.close()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--episodes", type=int, default=10000)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1,000 episodes")
    args = p.parse_args()
    n = 1000 if args.quick else args.episodes
    with tempfile.TemporaryDirectory(prefix="viewer-scale-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        make_store(root, n, args.calls)
        made_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        index = RunIndex(root)
        build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        pages = {"first page": "episodes?limit=50", "last page": f"episodes?limit=50&offset={n - 50}",
                 "sorted by tokens": "episodes?limit=50&sort=tokens&desc=true",
                 "filtered": "episodes?limit=50&task=task-17&min_reward=1", "summary": "summary",
                 "token page (cold: tokenizer load)": f"episodes/s{n // 2:06d}/tokens?segment=0&limit=4000",
                 "token page": f"episodes/s{n // 2 + 1:06d}/tokens?segment=0&limit=4000"}
        figures = {}
        with ServedApp(build_app([index])) as served, httpx.Client(base_url=served.url, timeout=120) as client:
            for name, path in pages.items():
                t0 = time.perf_counter()
                r = client.get(f"/api/runs/0/{path}")
                dt = time.perf_counter() - t0
                r.raise_for_status()
                figures[name] = {"ms": round(dt * 1000, 1), "kB": round(len(r.content) / 1e3, 1)}
                print(f"viewer  {name:<36} {dt * 1000:8.1f} ms  {len(r.content) / 1e3:9.1f} kB")
        store = Store(root / "trajectories.db")
        t0, c0 = time.perf_counter(), time.process_time()
        store.export_jsonl(root / "all.jsonl")
        jsonl_s, jsonl_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        store.close()
        jsonl_bytes = os.path.getsize(root / "all.jsonl")
        db_bytes = os.path.getsize(root / "trajectories.db")
    print(f"viewer  index build {build_s:.2f} s ({build_cpu_s:.2f} s CPU) over {n} episodes x {args.calls} calls (store {db_bytes / 1e6:.0f} MB, "
          f"made in {made_s:.0f} s)")
    print(f"baseline: the whole record as JSONL: {jsonl_s:.1f} s ({jsonl_cpu_s:.1f} s CPU), {jsonl_bytes / 1e6:.1f} MB")
    warm = {k: v for k, v in figures.items() if "cold" not in k}
    slowest = max(v["ms"] for v in warm.values())
    biggest = max(v["kB"] * 1e3 for v in figures.values())
    met = build_s <= 10 and slowest <= 250 and biggest <= 0.01 * jsonl_bytes
    print(json.dumps({"bench": "viewer_scale", "episodes": n, "calls_per_episode": args.calls,
                      "store_mb": round(db_bytes / 1e6, 1), "index_build_s": round(build_s, 2),
                      "index_build_cpu_s": round(build_cpu_s, 2), "pages": figures,
                      "slowest_warm_page_ms": slowest, "largest_page_fraction_of_jsonl": round(biggest / jsonl_bytes, 5),
                      "baseline_jsonl_s": round(jsonl_s, 1),
                      "baseline_jsonl_cpu_s": round(jsonl_cpu_s, 1), "baseline_jsonl_mb": round(jsonl_bytes / 1e6, 1),
                      "load": round(os.getloadavg()[0], 1), "target_met": met}))


if __name__ == "__main__":
    main()
