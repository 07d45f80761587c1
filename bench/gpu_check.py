"""GPU check (issue 12): the local engine and the built-in trainer on one device, one JSON line.

How to run it on a GPU box (one GPU, its own torch >= 2.11 with CUDA, transformers 5, no
network): carry `bench/wheels` (made here by `bash bench/gpu_check.sh --prepare-wheels`)
with the working tree, then

    bash bench/gpu_check.sh            # ~0.5B random-init Qwen2 shape, bf16, CUDA
    bash bench/gpu_check.sh --dry-run  # CPU, float32, 2 layers x hidden 64: the same code path
    bash bench/gpu_check.sh --dry-run --dtype bfloat16   # the bf16 path on CPU

The dry run differs only in sizes (vocab 512, prompts and completions of 8 tokens) and in
one torch thread each for the engine and the trainer.

What it does, all on the spot and offline:
1. builds a random-init model from a config (Qwen2.5-0.5B's shape: hidden 896, 24 layers,
   14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings) and a word-level
   tokenizer over the same vocabulary ("t<id>" words; the check uses token ids only), saved
   as safetensors + config + tokenizer into a temporary folder;
2. starts the local engine on it (`EngineServer`, device cuda, dtype bfloat16) and a proxy
   in front of it (`ProxyServer`, the weight-sync gate), and measures wall-clock decode
   tokens/s at 1, 16 and 64 concurrent /generate requests (prompts of 128 random ids,
   128 new tokens each, eos ignored), after 30 s of warm-up decoding (a fresh GPU machine
   decoded 3-4x slower in its first minute);
3. runs 3 GRPO steps of the built-in trainer (`TorchTrainer`, bf16 autocast, fp32 master
   weights) on the engine's own generations (8 prompts x 4, temperature 1; synthetic
   reward: the share of even token ids in the completion), each step followed by a weight
   sync `DiskWeightSync(gate=proxy)` as `trainers.loop` wires it (proxy paused -> engine
   paused -> loaded from disk as the new version -> continued -> proxy resumed);
4. after the last sync, scores a fixed batch the engine generated (16 seeded prompts at
   temperature 1, as trained on) with the trainer: |trainer logprob - engine logprob| over
   every sampled token, same weights (`logprob_mismatch`); 16 more at temperature 0.7 /
   top-p 0.9 / top-k 50 are scored in their filtered distribution (`mismatch_filtered`).
   The same fixed batch through the trainer's rollout correction (`trainers.correction`: TIS
   cap 2, sequence mask [0.5, 2]): `mismatch_correction` gives the shares truncated and masked
   and |log ratio| {mean, p50, p95, p99, max} before and after it (after: the truncated
   weight's |log| over the kept tokens); each step in `steps` carries the same shares.

`--engine sglang` (issue 45) runs steps 2-4 on SGLang, the engine GPU users run, instead of
the local engine: the launcher of `harnessrl engine sglang` (`trainers/engine/sglang_launch.py`)
starts `python -m sglang.launch_server` from the interpreter `--sglang-python` names (else
$SGLANG_PYTHON: a venv with `pip install 'harnessrl[gpu]'`; SGLang pins its own torch, so it
never shares the check's environment, and its wheels, over a GiB with its kernels, are too big
to carry: the GPU box must have that venv), on the same random-init model folder, with the
same weight syncs over SGLang's own routes (pause_generation, update_weights_from_disk,
continue_generation) and the same fixed-batch mismatch between the trainer and SGLang's
logprobs. The report's `engine` says which ran; `sglang` its version. A missing interpreter
or one without sglang ends the check at once with that error in the JSON line.

It prints one JSON line on stdout (progress goes to stderr), also when a phase fails or the
time limit's SIGTERM arrives (then with "error" and what was measured so far):
    {"device", "dtype", "params", "train_tokens_per_s", "mfu", "weight_sync_s",
     "decode_tokens_per_s": {"1", "16", "64"}, "logprob_mismatch": {"mean", "max"},
     "dry_run", "target_met", ...details}
- train_tokens_per_s: every token of the batch (prompt + completion) through forward and
  backward, per second of `TorchTrainer.step`, over steps 2-3 (step 1 warms up);
- mfu = 6 * params * train_tokens_per_s / peak dense bf16 FLOP/s of the device (H100/H200
  989e12, A100 312e12; unknown device or CPU: null); attention FLOPs are not counted;
- weight_sync_s: mean seconds of one `DiskWeightSync.push` (save + pause + load + resume);
- sample_ms_per_row: the engine's sampler on CPU over the whole vocabulary, per row (each
  decode step of B rows pays about B times this, whatever the device of the forward pass).

Targets (`target_met` is true only when all hold): every train step updated the weights;
after sync k the engine reports weight_version "k" (k = 1, 2, 3) and the next generations
carry it; the fixed batch's mismatch max is < 1e-2 in bf16 (< 1e-4 in float32, where the
filtered half must be < 1e-4 too; in bf16 a token at the top-k/top-p edge can fall on
either side and move the renormalization, so that half is reported, not a target); every
decode level produced all its tokens. There is no throughput target: the numbers
are measurements, not pass marks.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

#: The headline keys of the JSON line, in order (details follow them).
KEYS = ("device", "dtype", "params", "train_tokens_per_s", "mfu", "weight_sync_s", "decode_tokens_per_s",
        "logprob_mismatch", "dry_run", "target_met")
FULL = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=4096, rope_theta=10000.0)
SPECIALS = ["<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, EOS = 0, 1
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")
#: Peak dense bf16 FLOP/s by a substring of the device name (first match wins).
PEAK_BF16 = [("H200", 989e12), ("H100", 989e12), ("A100", 312e12)]
CONCURRENCY = (1, 16, 64)
STEPS = 3
PROMPTS, GROUP = 8, 4
FIXED = 16  #: fixed-batch prompts per sampling setting
FILTERED = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}
#: The trainer's rollout correction in the check: the default TIS cap and a sequence mask.
CORRECTION = {"tis_cap": 2.0, "seq_mask": (0.5, 2.0)}


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_model(folder: Path, shape: dict, device: str) -> None:
    """Random-init Qwen2 (seed 0) + a word-level tokenizer over the same ids, saved to `folder`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {w: i for i, w in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), shape["vocab_size"])})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(**shape, tie_word_embeddings=True, use_sliding_window=False, rms_norm_eps=1e-6,
                         bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    del model


async def generate(http, prompt: list[int], n: int, *, temperature: float = 1.0, top_p: float = 1.0,
                   top_k: int = -1, seed: int | None = None, ignore_eos: bool = False):
    """One /generate call on the engine: (output ids, their logprobs, weight_version)."""
    sp = {"max_new_tokens": n, "temperature": temperature, "top_p": top_p, "top_k": top_k, "ignore_eos": ignore_eos}
    if seed is not None:
        sp["sampling_seed"] = seed
    r = await http.post("/generate", json={"input_ids": prompt, "sampling_params": sp, "return_logprob": True})
    if r.status_code != 200:
        raise RuntimeError(f"engine /generate answered {r.status_code}: {r.text[:300]}")
    meta = r.json()["meta_info"]
    entries = meta["output_token_logprobs"]
    return [int(e[1]) for e in entries], [float(e[0]) for e in entries], str(meta["weight_version"])


def trajectory(sid: str, task: str, prompt, ids, lps, version: int, sampling: dict):
    """One single-call record as the proxy would write it (segment + call with its sampling)."""
    from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory

    n = len(prompt)
    seg = Segment(token_ids=list(prompt) + ids, loss_mask=[0] * n + [1] * len(ids),
                  logprobs=[0.0] * n + lps, versions=[-1] * n + [version] * len(ids))
    call = CallRecord(call_id=f"{sid}-0", session_id=sid, index=0, dialect="native", prompt_prefix_len=0,
                      new_prompt_ids=list(prompt), completion_ids=ids, logprobs=lps,
                      versions=[version] * len(ids), finish_reason="length", segment=0,
                      flags={"sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, **sampling,
                                          "logprobs": "sampled"}})
    reward = sum(1 for t in ids if t % 2 == 0) / max(1, len(ids))
    return Trajectory(session_id=sid, segments=[seg], reward=reward, status="ok", termination="submitted",
                      task_id=task, calls=[call])


def prompts(rng: random.Random, k: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(len(SPECIALS), vocab) for _ in range(length)] for _ in range(k)]


async def decode_levels(http, rng, plen: int, new: int, vocab: int, warmup_s: float) -> dict[str, float]:
    # Warm-up for `warmup_s` of decoding at 1 and 16 concurrent: on a fresh H200 machine the same
    # decode loop ran 3-4x slower in its first minute (HF's own loop: 62-65 ms a step first,
    # 16-17 ms after ~30 s; bench/gpu_decode_profile.py), which the first level paid alone.
    t0 = time.perf_counter()
    while True:
        for c in (1, 16):
            await asyncio.gather(*(generate(http, p, 16, ignore_eos=True) for p in prompts(rng, c, plen, vocab)))
        if time.perf_counter() - t0 >= warmup_s:
            break
    log(f"decode warm-up: {time.perf_counter() - t0:.1f} s")
    out = {}
    for c in CONCURRENCY:
        batch = prompts(rng, c, plen, vocab)
        t0 = time.perf_counter()
        res = await asyncio.gather(*(generate(http, p, new, ignore_eos=True) for p in batch))
        wall = time.perf_counter() - t0
        tokens = sum(len(ids) for ids, _, _ in res)
        out[str(c)] = round(tokens / wall, 2) if tokens == c * new else 0.0
        log(f"decode x{c}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s")
    return out


async def rollouts(http, rng, step: int, version: int, plen: int, new: int, vocab: int):
    """GRPO batch: PROMPTS tasks x GROUP samples at temperature 1; also the versions the engine reported."""
    tasks = prompts(rng, PROMPTS, plen, vocab)
    jobs = [(t, g) for t in range(PROMPTS) for g in range(GROUP)]
    res = await asyncio.gather(*(generate(http, tasks[t], new) for t, g in jobs))
    batch = [trajectory(f"s{step}-{t}-{g}", f"task{step}-{t}", tasks[t], ids, lps, version, {})
             for (t, g), (ids, lps, _) in zip(jobs, res)]
    return batch, {v for _, _, v in res}


def sample_ms_per_row(vocab: int, rows: int = 64, repeats: int = 3) -> float:
    """The engine's sampler (on CPU, for any device) on [rows, vocab] logits at temperature 1:
    milliseconds per row, to read the decode numbers against."""
    import torch

    from harnessrl.trainers.engine.sampling import RowParams, sample

    logits, gen = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)), torch.Generator()
    params = [RowParams(1.0) for _ in range(rows)]
    sample(logits, params, gen)
    t0 = time.perf_counter()
    for _ in range(repeats):
        sample(logits, params, gen)
    return round((time.perf_counter() - t0) * 1000 / (repeats * rows), 3)


def fixed_batch_mismatch(trainer, batch) -> dict:
    """|trainer logprob - engine logprob| over every sampled token of `batch`, no update; and what
    the trainer's rollout correction (`trainers.correction`) makes of it: "correction" holds the
    shares it truncates and masks, and |log ratio| {mean, p50, p95, p99, max} before and after
    (after: the TIS-truncated weight's |log| over the tokens the masks keep)."""
    import math

    import torch

    from harnessrl.trainers.batching import collate, plan_micro_batches, token_logprobs
    from harnessrl.trainers.correction import Tally, keep_mask, log_ratio, ratio_summary
    from harnessrl.trainers.samples import build_samples

    sb = build_samples(batch, trainer.config.samples, current_version=trainer.version,
                       vocab_size=trainer.vocab_size, temperature=1.0)
    corr = trainer.config.correction
    cap = math.log(corr.tis_cap) if corr.tis_cap is not None else math.inf
    diffs, after, tally = [], [], Tally()
    trainer.model.eval()
    dtype = trainer.autocast_dtype
    for idx in plan_micro_batches(sb.samples, trainer.config.micro_batch_tokens):
        mb = collate([sb.samples[i] for i in idx], trainer.pad_id, trainer.device)
        with torch.no_grad(), torch.autocast(trainer.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            lp = token_logprobs(trainer.model, mb)
        diffs.append((lp - mb.behav_logprobs).abs()[mb.mask > 0].double().cpu())
        delta = log_ratio(lp, mb.behav_logprobs)
        keep, token_keep, seq = keep_mask(delta, mb.mask, corr)
        tally.add(delta, mb.mask, delta > cap, token_keep, keep, seq)
        after.append(delta.clamp(max=cap).abs()[(mb.mask > 0) & keep].cpu())
    d = torch.cat(diffs)
    figures = tally.metrics()
    correction = {"tis_cap": corr.tis_cap, "token_mask": corr.token_mask, "seq_mask": corr.seq_mask,
                  **{k: figures[k] for k in ("tis_truncated_frac", "masked_frac", "seq_masked_frac",
                                              "seq_ratio_min", "seq_ratio_max")},
                  "before": ratio_summary(d), "after": ratio_summary(torch.cat(after))}
    return {"mean": float(d.mean()), "max": float(d.max()), "tokens": int(d.numel()), "correction": correction}


async def run(args, tmp: Path, report: dict) -> dict:
    """The check; fills `report` as it goes (what is there is printed if a later phase fails)."""
    import httpx
    import torch

    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy import ProxyConfig, ProxyServer
    from harnessrl.trainers.engine import EngineServer
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig
    from harnessrl.trainers.weight_sync import DiskWeightSync

    dry = args.dry_run
    report["engine"] = args.engine
    if args.engine == "sglang":  # before anything is built: a box without sglang fails at once
        from harnessrl.trainers.engine.sglang_launch import check_python

        if not args.sglang_python:
            raise RuntimeError("--engine sglang: name the interpreter of an sglang venv (--sglang-python or "
                               "$SGLANG_PYTHON)")
        check_python(args.sglang_python)
        report["sglang"] = subprocess.run([args.sglang_python, "-c", "import sglang; print(sglang.__version__)"],
                                          capture_output=True, text=True, timeout=300).stdout.strip()
    if not dry and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device; run with --dry-run for the CPU path")
    device = "cpu" if dry else "cuda"
    dtype = args.dtype or ("float32" if dry else "bfloat16")
    shape = TINY if dry else FULL
    plen, new = (8, 8) if dry else (128, 128)
    threads = 1 if dry else None  # CPU: one torch thread each for engine and trainer (small ops, shared cores)
    if threads:
        torch.set_num_threads(threads)
    vocab = shape["vocab_size"]
    rng = random.Random(0)
    model_dir = tmp / "model"
    t0 = time.perf_counter()
    build_model(model_dir, shape, device)
    log(f"model built in {time.perf_counter() - t0:.1f} s at {model_dir}")
    report.update(device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu", dtype=dtype,
                  dry_run=dry, shape=shape)
    tok = load_tokenizer(str(model_dir))
    if args.engine == "sglang":
        from harnessrl.trainers.engine.sglang_launch import SGLangLaunch, SGLangServer

        engine_cm = SGLangServer(SGLangLaunch(
            python=args.sglang_python, model=str(model_dir), port=0, weight_version="0", startup_timeout_s=300.0,
            extra=("--dtype", dtype, "--random-seed", "0", "--max-running-requests", "64",
                   "--mem-fraction-static", "0.6", *(["--device", "cpu"] if device == "cpu" else []))))
    else:
        engine_cm = EngineServer(model=str(model_dir), device=device, dtype=dtype, max_running_requests=64,
                                 max_prefill_per_step=8, weight_version="0", random_seed=0, num_threads=threads)
    with engine_cm as engine, \
            ProxyServer(ProxyConfig(engine_url=engine.url, model=str(model_dir)), tokenizer=tok) as proxy:
        http = httpx.AsyncClient(base_url=engine.url, timeout=300, limits=httpx.Limits(max_connections=128))
        client = EngineClient(engine.url)
        report["decode_tokens_per_s"] = await decode_levels(http, rng, plen, new, vocab, 0.0 if dry else 30.0)
        report["sample_ms_per_row"] = sample_ms_per_row(vocab)
        log(f"engine sampler: {report['sample_ms_per_row']} ms per row at vocab {vocab}")
        trainer = TorchTrainer(TorchTrainerConfig(model=str(model_dir), device=device, dtype=dtype, lr=1e-5,
                                                  micro_batch_tokens=8192, correction=CORRECTION))
        params = report["params"] = sum(p.numel() for p in trainer.model.parameters())
        sync = DiskWeightSync(client, tmp / "weights", gate=proxy)
        steps, syncs, reported, carried = [], [], [], []
        report.update(steps=steps, weight_sync_each_s=syncs, engine_weight_versions=reported)
        for k in range(STEPS):
            batch, versions = await rollouts(http, rng, k, trainer.version, plen, new, vocab)
            carried.append(sorted(versions))
            m = trainer.step(batch)
            tokens = sum(len(s.token_ids) for t in batch for s in t.segments)
            steps.append({"updated": m.updated, "step_s": round(m.step_s, 4), "tokens": tokens,
                          "sampled_tokens": m.tokens, "loss": m.loss, "grad_norm": m.grad_norm,
                          "mismatch_max": m.logprob_mismatch_max, "log_ratio_abs_p99": m.log_ratio_abs_p99,
                          "tis_truncated_frac": m.tis_truncated_frac, "masked_frac": m.masked_frac})
            version = await sync.push(trainer)
            syncs.append(round(sync.last_sync_s, 3))
            reported.append(str((await client.model_info())["weight_version"]))
            log(f"step {k + 1}: {tokens} tokens in {m.step_s:.2f} s, sync {sync.last_sync_s:.2f} s, "
                f"engine reports version {reported[-1]} (trainer {version})")
        # the fixed batch: FIXED prompts at temperature 1 (what the steps train on), FIXED more
        # with top-p/top-k filters, all seeded, all sampled by the synced weights
        fixed_prompts = prompts(random.Random(1), 2 * FIXED, plen, vocab)
        res = await asyncio.gather(*(generate(http, p, new, seed=i, **(FILTERED if i >= FIXED else {}))
                                     for i, p in enumerate(fixed_prompts)))
        carried.append(sorted({v for _, _, v in res}))
        fixed = [trajectory(f"fixed-{i}", f"fixed{i // 2}", p, ids, lps, trainer.version,
                            FILTERED if i >= FIXED else {})
                 for i, (p, (ids, lps, _)) in enumerate(zip(fixed_prompts, res))]
        mismatch = fixed_batch_mismatch(trainer, fixed[:FIXED])
        filtered = {**FILTERED, **fixed_batch_mismatch(trainer, fixed[FIXED:])}
        await client.aclose()
        await http.aclose()
    warm = steps[1:] or steps
    train_tps = sum(s["tokens"] for s in warm) / sum(s["step_s"] for s in warm)
    peak = next((f for name, f in PEAK_BF16 if name in report["device"]), None) if device == "cuda" else None
    bound = 1e-4 if dtype == "float32" else 1e-2
    checks = {
        "all_steps_updated": all(s["updated"] for s in steps),
        "engine_version_bumped": reported == [str(k + 1) for k in range(STEPS)],
        "generations_carry_version": carried == [[str(k)] for k in range(STEPS + 1)],
        "mismatch_below_bound": mismatch["max"] < bound,
        # float32 must match under the filters too; in bf16 a token at the top-k/top-p edge can
        # fall on either side, which moves the renormalization (reported, not a target)
        **({"filtered_mismatch_below_bound": filtered["max"] < bound} if dtype == "float32" else {}),
        "decode_all_levels": all(v > 0 for v in report["decode_tokens_per_s"].values()),
    }
    report.update({
        "train_tokens_per_s": round(train_tps, 2),
        "mfu": round(6 * params * train_tps / peak, 4) if peak else None,
        "weight_sync_s": round(sum(syncs) / len(syncs), 3),
        "logprob_mismatch": {"mean": mismatch["mean"], "max": mismatch["max"]},
        "mismatch_correction": mismatch["correction"],
        "target_met": all(checks.values()),
        "checks": checks,
        "mismatch_bound": bound,
        "mismatch_tokens": mismatch["tokens"],
        "mismatch_filtered": filtered,
        "prompt_tokens": plen,
        "new_tokens": new,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    })
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, float32, tiny model: the same code path")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                    help="engine and trainer dtype (default: bfloat16 on CUDA, float32 in the dry run)")
    ap.add_argument("--engine", choices=["local", "sglang"], default="local",
                    help="the generation engine: harnessrl's local engine, or SGLang (module doc)")
    ap.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON"),
                    help="with --engine sglang: the interpreter of a venv that has sglang (default $SGLANG_PYTHON)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="harnessrl-gpu-check-"))
    report: dict = {"dry_run": args.dry_run}

    def finish(error: str | None) -> None:
        if error is not None:  # what was measured so far, and why the rest is missing
            report.update(error=error, target_met=False)
        report["wall_s"] = round(time.perf_counter() - t0, 1)
        head = {k: report[k] for k in KEYS if k in report}  # the headline keys first
        print(json.dumps({**head, **report}), flush=True)

    def on_term(signum, frame):  # `timeout` in gpu_check.sh: print now, skip the slow clean-up
        finish(f"stopped by signal {signum} (the time limit) after {time.perf_counter() - t0:.0f} s")
        shutil.rmtree(tmp, ignore_errors=True)
        os._exit(124)

    signal.signal(signal.SIGTERM, on_term)
    try:
        asyncio.run(run(args, tmp, report))
    except Exception as e:  # one JSON line whatever happens: the device run is one shot
        log(traceback.format_exc())
        finish(f"{type(e).__name__}: {e}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the model and every published version
    finish(None)
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
