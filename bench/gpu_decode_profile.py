"""Where a decode step of the local engine goes on a GPU: one prepared diagnosis run.

`bench/gpu_check.sh` first measured the local engine on a fresh H200 machine (Qwen2.5-0.5B
shape, bf16) at 7.9 tokens/s at 1 concurrent request: ~126 ms a step. This script splits
the step, on the same model, in the check's environment:

1. `hf_loop_ms`: HF's own forward with a `DynamicCache`, batch 1 and 16, token by token,
   CUDA-synchronized per step (what the engine's step is built on);
2. the engine itself (`EngineServer`, /generate over loopback HTTP, like gpu_check), batch 1
   and 16, with the scheduler thread's Python profile (cProfile, top functions by own time)
   and wall time per piece: the model's forward, `sample`, admission.
Both after 25 s of warm-up decoding (a fresh machine ran the same loop 3-4x slower in its
first minute). `target_met`: the engine's batch-1 step, its profiler on, is within 1.25x of
HF's own loop (what the engine adds around the forward is small).

`--ab`: the SDPA backends (cuDNN, flash, math) interleaved, 3 rounds, prompts of 128 and
2,048, after the same warm-up; `target_met`: at both lengths torch's default choice (cuDNN
on Hopper) is within 1.1x of the fastest backend, so the engine need not pick one. What it
showed (2026-12-04, H200, torch 2.11): once warm, HF's batch-1 step is
16-17 ms with cuDNN or flash attention alike (math 21 ms): the step is launch-bound (24
layers of small kernels), and the first measurement's 62-65 ms was the fresh machine's first
minute, not a backend (the check, run after a minute of the profile's decoding: 51.5 tokens/s at x1).

The first profile run (before the warm-up was added) measured HF's loop at 62.3 ms a step
against the engine's 64.5 ms at batch 1, and `scaled_dot_product_attention` as 70% of the
engine thread's time; the warm A/B above then showed that time was the machine's first
minute.

Run: `GPU_CHECK_SCRIPT=bench/gpu_decode_profile.py bash bench/gpu_check.sh [--ab] [--dry-run]`
(`--dry-run`: CPU, tiny model, 2 s of warm-up). The last stdout line is one JSON object with
`target_met`; profile tables go to stderr.
"""
from __future__ import annotations

import asyncio
import collections
import cProfile
import io
import json
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import FULL, SPECIALS, TINY, build_model, generate, log  # noqa: E402


def hf_loop_ms(model, batch: int, plen: int, steps: int, vocab: int) -> float:
    """Mean ms per decode step of HF's forward with a DynamicCache (synchronized each step)."""
    import torch
    from transformers import DynamicCache

    dev = model.device
    ids = torch.randint(len(SPECIALS), vocab, (batch, plen), device=dev)
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
    return round((time.perf_counter() - t0) * 1000 / steps, 3)


def warm_model(dry: bool):
    """(device, dtype, shape, model folder, model): the check's random-init model built and
    loaded, then decoded with for 25 s (2 s dry), since a fresh GPU machine ran the same loop
    3-4x slower in its first minute."""
    import torch

    from harnessrl.trainers.engine.weights import load_model

    device, dtype, shape = ("cpu", "float32", TINY) if dry else ("cuda", "bfloat16", FULL)
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-gpu-profile-")) / "model"
    build_model(folder, shape, device)
    model = load_model(folder, dtype=getattr(torch, dtype), device=device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < (2 if dry else 25):
        hf_loop_ms(model, 1, 128, 32, shape["vocab_size"])
    return device, dtype, shape, folder, model


def ab(dry: bool) -> int:
    """`--ab`: SDPA backends interleaved in one warm process (batch 1, prompts of 128 and 2,048)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, dtype, shape, _, model = warm_model(dry)
    out: dict = collections.defaultdict(list)
    for rep in range(3):
        for plen in (128, 2048):
            for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "MATH"):
                try:
                    with sdpa_kernel([getattr(SDPBackend, name)]):
                        out[f"{name}@{plen}"].append(hf_loop_ms(model, 1, plen, 32, shape["vocab_size"]))
                except RuntimeError as e:
                    out[f"{name}@{plen}"].append(str(e)[:60])
    log(f"A/B ms/step: {dict(out)}")
    best = {k: min(x for x in v if isinstance(x, float)) for k, v in out.items() if any(isinstance(x, float) for x in v)}
    met = all(f"CUDNN_ATTENTION@{n}" in best
              and best[f"CUDNN_ATTENTION@{n}"] <= 1.1 * min(v for k, v in best.items() if k.endswith(f"@{n}"))
              for n in (128, 2048))
    print(json.dumps({"device": device, "dtype": dtype, "ab_ms_per_step": out, "best_ms_per_step": best,
                      "target_met": met}))
    return 0


def main() -> int:
    import httpx
    import torch

    from harnessrl.trainers.engine import EngineServer, scheduler as sched_mod

    dry = "--dry-run" in sys.argv
    if "--ab" in sys.argv:
        return ab(dry)
    device, dtype, shape, folder, model = warm_model(dry)
    vocab, plen, new = shape["vocab_size"], (8 if dry else 128), (16 if dry else 64)
    report: dict = {"device": device, "dtype": dtype}
    report["hf_loop_ms"] = {str(b): hf_loop_ms(model, b, plen, new, vocab) for b in (1, 16)}
    log(f"HF loop ms/step: {report['hf_loop_ms']}")
    del model

    # wall time per piece inside the engine's step, and a Python profile of its thread
    T: dict = collections.defaultdict(float)
    N: collections.Counter = collections.Counter()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(name, fn):
        def wrapper(*a, **k):
            sync()
            t = time.perf_counter()
            r = fn(*a, **k)
            sync()
            T[name] += time.perf_counter() - t
            N[name] += 1
            return r
        return wrapper

    sched_mod.sample = timed("sample", sched_mod.sample)
    Sched = sched_mod.Scheduler
    Sched._decode_step = timed("decode_step", Sched._decode_step)
    Sched._admit = timed("admit", Sched._admit)
    prof = cProfile.Profile()
    loop = Sched._loop

    def profiled_loop(self):
        prof.enable()
        try:
            loop(self)
        finally:
            prof.disable()
    Sched._loop = profiled_loop

    async def levels(url: str) -> dict:
        rng = random.Random(0)
        out = {}
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:
            await generate(http, [rng.randrange(len(SPECIALS), vocab) for _ in range(plen)], 4, ignore_eos=True)
            for c in (1, 16):
                T.clear()
                N.clear()
                batch = [[rng.randrange(len(SPECIALS), vocab) for _ in range(plen)] for _ in range(c)]
                t0 = time.perf_counter()
                await asyncio.gather(*(generate(http, p, new, ignore_eos=True) for p in batch))
                wall = time.perf_counter() - t0
                out[str(c)] = {"tok_s": round(c * new / wall, 1), "ms_per_step": round(wall * 1000 / new, 2),
                               **{f"{k}_ms": round(T[k] * 1000 / max(1, N[k]), 3) for k in T},
                               "calls": dict(N)}
                log(f"engine x{c}: {out[str(c)]}")
        return out

    with EngineServer(model=str(folder), device=device, dtype=dtype, max_running_requests=64,
                      max_prefill_per_step=8, weight_version="0", random_seed=0) as engine:
        model = engine.state.scheduler.model
        model.forward = timed("forward", model.forward)
        report["engine"] = asyncio.run(levels(engine.url))
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
    print(s.getvalue(), file=sys.stderr)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(35)
    print(s.getvalue(), file=sys.stderr)
    report["threads"] = torch.get_num_threads()
    report["engine_over_hf_x1"] = round(report["engine"]["1"]["ms_per_step"] / report["hf_loop_ms"]["1"], 3)
    report["target_met"] = report["engine_over_hf_x1"] <= 1.25
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
