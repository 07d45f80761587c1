"""Throughput of the local engine with 1, 4 and 16 concurrent requests vs sequential HF generate.

Same model, same prompts, same number of new tokens per request (eos ignored on both
sides, greedy), measured one after the other in this run:

- baseline: `model.generate` on one prompt at a time, in this process;
- engine: `python -m harnessrl.trainers.engine` in a subprocess, driven over loopback HTTP
  with C requests in flight at a time (closed loop over the same prompts).

Prints a table of tokens/s and the ratio to the baseline, then ONE JSON line with the
figures and `target_met` (ratio at 16 concurrent >= 4).

    .venv/bin/python bench/engine_throughput.py [--model smollm2-135m] [--max-new-tokens 64] [--threads 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

TARGET = 4.0


def prompts(tokenizer, n: int) -> list[list[int]]:
    tasks = ["fix the failing test in utils.py", "add type hints to the parser", "explain this stack trace",
             "write a regex for ISO dates", "refactor the retry loop", "find the off-by-one error",
             "document the config loader", "speed up the CSV reader"]
    return [tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a careful coding assistant."},
         {"role": "user", "content": f"Please {tasks[i % len(tasks)]} (request {i})."}],
        add_generation_prompt=True, return_dict=False) for i in range(n)]


def hf_sequential(model_name: str, ps: list[list[int]], new_tokens: int, threads: int | None) -> float:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from harnessrl.gym.models import resolve_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model(model_name)), dtype=torch.float32).eval()

    def run(p: list[int]) -> int:
        out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=2)
        if out.shape[1] - len(p) != new_tokens:
            raise SystemExit(f"HF generate returned {out.shape[1] - len(p)} tokens, asked for {new_tokens}")
        return new_tokens

    with torch.no_grad():
        model.generate(torch.tensor([ps[0][:8]]), attention_mask=torch.ones(1, 8, dtype=torch.long),
                       max_new_tokens=4, pad_token_id=2)  # warm-up
        start = time.perf_counter()
        tokens = sum(run(p) for p in ps)
        return tokens / (time.perf_counter() - start)


def start_engine(model_name: str, max_running: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    log = tempfile.NamedTemporaryFile("w+", prefix="engine-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.trainers.engine", "--model", model_name, "--port", "0",
         "--max-running-requests", str(max_running)] + (["--num-threads", str(threads)] if threads else []),
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        log.seek(0)
        raise SystemExit(f"engine did not start: {line}{log.read()}")
    # keep draining its stdout so a full pipe can never block the engine
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    print(f"engine log: {log.name}", file=sys.stderr)
    return proc, line.split(" on ", 1)[1].split()[0]


async def engine_tps(url: str, ps: list[list[int]], new_tokens: int, concurrency: int) -> float:
    import httpx

    # plain HTTP: the request needs ignore_eos, which EngineClient does not expose
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(p: list[int]) -> int:
            r = await client.post("/generate", json={
                "input_ids": p, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                    "ignore_eos": True}})
            r.raise_for_status()
            got = r.json()["meta_info"]["completion_tokens"]
            if got != new_tokens:
                raise SystemExit(f"engine returned {got} tokens, asked for {new_tokens}: {r.json()['meta_info']}")
            return got

        await client.post("/generate", json={"input_ids": ps[0][:8], "sampling_params": {"max_new_tokens": 4}})
        queue = list(ps)
        done = 0

        async def worker():
            nonlocal done
            while queue:
                tokens = await one(queue.pop())  # not `done += await ...`: that reads done before awaiting
                done += tokens

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=16, help="prompts per measurement")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads on each side (default 1: on a shared machine, OpenMP with more "
                         "threads than free cores collapses and swamps the comparison; 0 = torch's default)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from harnessrl.gym.models import load_tokenizer

    ps = prompts(load_tokenizer(args.model), args.requests)
    base = hf_sequential(args.model, ps, args.max_new_tokens, args.threads)
    print(f"HF generate, sequential: {base:.1f} tokens/s", file=sys.stderr, flush=True)
    proc, url = start_engine(args.model, max(levels), args.threads)
    try:
        engine = {}
        for c in levels:
            engine[c] = asyncio.run(engine_tps(url, ps * max(1, c // len(ps)), args.max_new_tokens, c))
            print(f"engine, {c} concurrent: {engine[c]:.1f} tokens/s", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

    ratios = {c: engine[c] / base for c in levels}
    print(f"model {args.model}, {args.requests} prompts x {args.max_new_tokens} new tokens, "
          f"{os.cpu_count()} CPUs, torch threads {args.threads or 'default'}")
    print(f"{'setting':<28}{'tokens/s':>10}{'vs HF seq':>11}")
    print(f"{'HF generate, sequential':<28}{base:>10.1f}{1.0:>10.2f}x")
    for c in levels:
        print(f"{f'engine, {c} concurrent':<28}{engine[c]:>10.1f}{ratios[c]:>10.2f}x")
    top = max(levels)
    print(json.dumps({
        "model": args.model, "max_new_tokens": args.max_new_tokens, "requests": args.requests,
        "threads": args.threads,
        "hf_sequential_tok_s": round(base, 2),
        "engine_tok_s": {str(c): round(engine[c], 2) for c in levels},
        "ratio_vs_hf": {str(c): round(ratios[c], 3) for c in levels},
        "target": f"ratio at {top} concurrent >= {TARGET}",
        "target_met": bool(ratios[top] >= TARGET),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
