"""Rollout correction in the bf16 case: the local engine samples in bfloat16, the built-in
trainer scores in float32; uncorrected vs TIS vs TIS + sequence mask, side by side in one run.

    .venv/bin/python bench/rollout_correction.py [--model init:0.1 | --model smollm2-135m]
        [--batches 3] [--prompts 8] [--tokens 32] [--tamper 3.0]

- The model: `init:R` builds tiny-llama's shape (2 layers, hidden 64, SmolLM2's tokenizer and
  chat template) with random weights of initializer_range R (0.1: logits as peaked as a trained
  model's, so bf16 rounding moves logprobs by the ~1e-2 the GPU run measured); or a prepared
  model by name (smollm2-135m: the real model, minutes on a CPU).
- Per batch (its own seed): `--prompts` chat prompts, groups of two (rewards 1 and 0, so every
  advantage is +-1), `--tokens` tokens each, sampled by the engine at temperature 1 over HTTP
  and recorded as the proxy records them (`engine_records`).
- "tampered": the same batch with a deliberately large mismatch: in two sequences of advantage
  +1 every recorded logprob lowered by `--tamper` nats (a broken kernel or a mislabelled
  version: a ratio of e^3 = 20 per token).
- Each variant trains a fresh float32 trainer one step (decoupled PPO, one update) on the clean
  and on the tampered batch: "uncorrected" (no behaviour cap, no TIS, no mask), "tis" (tis_cap
  2), "tis+seq" (tis_cap 2, seq_mask [0.5, 2]).

Printed per variant: the mismatch (|log ratio| mean/p99/max over trained tokens), the share of
tokens truncated and of sequences masked, |pg_loss| and the gradient norm (before clipping) as
min..max over the batches, and the tampered-to-clean gradient-norm ratio. Ends with one JSON
line; `target_met` is true when all hold: the bf16 mismatch is real (mean > 1e-3); on every
tampered batch the TIS variants' |pg_loss| <= C·max|A| = 2 while the uncorrected one's is above
it; tis+seq masks exactly the tampered sequences and its tampered gradient norm is within 1.5x
of its clean one, while the uncorrected one's is more than 3x.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
from pathlib import Path

#: Variants: name -> the trainer config's correction-related fields.
VARIANTS = {
    "uncorrected": {"behav_cap": None, "correction": {"tis_cap": None}},
    "tis": {"behav_cap": None, "correction": {"tis_cap": 2.0}},
    "tis+seq": {"behav_cap": None, "correction": {"tis_cap": 2.0, "seq_mask": (0.5, 2.0)}},
}
TIS_CAP = 2.0


def build_model(folder: Path, init_range: float, seed: int = 0) -> Path:
    """tiny-llama's config and tokenizer with fresh random weights of `init_range`, saved to `folder`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from harnessrl.gym.models import load_tokenizer, resolve_model

    src = resolve_model("tiny-llama")
    cfg = AutoConfig.from_pretrained(str(src))
    cfg.initializer_range = init_range
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    load_tokenizer(str(src)).save_pretrained(folder)
    return folder


def record(sid: str, task: str, prompt: list[int], ids: list[int], lps: list[float], reward: float):
    """One single-call trajectory as the proxy writes it (segment + call with its sampling)."""
    from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory

    n = len(prompt)
    seg = Segment(token_ids=prompt + ids, loss_mask=[0] * n + [1] * len(ids), logprobs=[0.0] * n + lps,
                  versions=[-1] * n + [0] * len(ids))
    call = CallRecord(call_id=f"{sid}-0", session_id=sid, index=0, dialect="native", prompt_prefix_len=0,
                      new_prompt_ids=prompt, completion_ids=ids, logprobs=lps, versions=[0] * len(ids),
                      finish_reason="length", segment=0,
                      flags={"sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": "sampled"}})
    return Trajectory(session_id=sid, segments=[seg], reward=reward, status="ok", termination="submitted",
                      task_id=task, calls=[call])


def engine_records(url: str, tok, prompts: int, tokens: int, seed: int) -> list:
    """`prompts` chat prompts sampled by the engine at `url` (seeded), groups of two rewarded 1 and 0."""
    import httpx

    out = []
    for i in range(prompts):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"fix bug {seed}-{i // 2}"}],
                                         add_generation_prompt=True, return_dict=False)
        r = httpx.post(url + "/generate", timeout=600, json={
            "input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 1.0, "ignore_eos": True,
                                "sampling_seed": seed * 1000 + i}})
        r.raise_for_status()
        entries = r.json()["meta_info"]["output_token_logprobs"]
        out.append(record(f"b{seed}-{i}", f"task{seed}-{i // 2}", list(prompt), [int(e[1]) for e in entries],
                          [float(e[0]) for e in entries], 1.0 if i % 2 == 0 else 0.0))
    return out


def tamper(batch: list, nats: float) -> tuple[list, set[str]]:
    """A copy of `batch` whose first two reward-1 sequences have every recorded logprob `nats` lower."""
    hit = [t.session_id for t in batch if t.reward == 1.0][:2]
    out = []
    for t in batch:
        t = copy.deepcopy(t)
        if t.session_id in hit:
            seg = t.segments[0]
            seg.logprobs = [lp - nats if m else lp for lp, m in zip(seg.logprobs, seg.loss_mask)]
            t.calls[0].logprobs = [lp - nats for lp in t.calls[0].logprobs]
        out.append(t)
    return out, set(hit)


def train_once(model: str, variant: str, batch: list, lr: float = 1e-5):
    """One step of a fresh float32 trainer with `variant`'s correction on `batch`: its StepMetrics."""
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

    cfg = TorchTrainerConfig(model=model, device="cpu", dtype="float32", lr=lr, seed=0, **VARIANTS[variant])
    return TorchTrainer(cfg).step(batch)


def run(a) -> dict:
    import torch

    from harnessrl.gym.models import load_tokenizer
    from harnessrl.trainers.engine import EngineServer

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_model(Path(tmp) / "model", float(a.model[5:]))) if a.model.startswith("init:") else a.model
        tok = load_tokenizer(model)
        with EngineServer(model=model, dtype=a.engine_dtype, weight_version="0", random_seed=0,
                          num_threads=a.threads) as engine:
            batches = [engine_records(engine.url, tok, a.prompts, a.tokens, seed) for seed in range(a.batches)]
        rows = {v: {"clean": [], "tampered": []} for v in VARIANTS}
        hits = []
        for b, clean in enumerate(batches):
            bad, hit = tamper(clean, a.tamper)
            hits.append(len(hit))
            for v in VARIANTS:
                for kind, batch in (("clean", clean), ("tampered", bad)):
                    rows[v][kind].append(train_once(model, v, batch).to_dict())
                print(f"batch {b}  {v:11s}  clean gnorm {rows[v]['clean'][-1]['grad_norm']:.4f}  "
                      f"tampered gnorm {rows[v]['tampered'][-1]['grad_norm']:.4f}", file=sys.stderr, flush=True)
    return summarize(a, rows, hits)


def summarize(a, rows: dict, hits: list[int]) -> dict:
    """The side-by-side table (stdout) and the JSON figures with `target_met`."""
    clean = rows["uncorrected"]["clean"]
    mismatch = {"mean": statistics.mean(m["logprob_mismatch_mean"] for m in clean),
                "max": max(m["logprob_mismatch_max"] for m in clean)}
    out = {}
    print(f"engine {a.engine_dtype} vs trainer float32, model {a.model}: |trainer - engine| logprob mean "
          f"{mismatch['mean']:.2e}, max {mismatch['max']:.2e} over {sum(m['mismatch_tokens'] for m in clean)} tokens")
    print(f"{'variant':12s} {'batch':9s} {'|lr| mean':>10s} {'p99':>8s} {'max':>8s} {'trunc':>7s} {'seqmask':>8s} "
          f"{'|pg_loss| min..max':>20s} {'gnorm min..max':>18s}")
    for v, kinds in rows.items():
        fig = out[v] = {}
        for kind, ms in kinds.items():
            loss = [abs(m["pg_loss"]) for m in ms]
            gn = [m["grad_norm"] for m in ms]
            fig[kind] = {"log_ratio_abs_mean": statistics.mean(m["log_ratio_abs_mean"] for m in ms),
                         "log_ratio_abs_p99": max(m["log_ratio_abs_p99"] for m in ms),
                         "log_ratio_abs_max": max(m["log_ratio_abs_max"] for m in ms),
                         "tis_truncated_frac": statistics.mean(m["tis_truncated_frac"] for m in ms),
                         "seq_masked_frac": statistics.mean(m["seq_masked_frac"] for m in ms),
                         "pg_loss_abs": [min(loss), max(loss)], "grad_norm": [min(gn), max(gn)],
                         "seq_masked": [round(m["seq_masked_frac"] * a.prompts) for m in ms]}
            f = fig[kind]
            print(f"{v:12s} {kind:9s} {f['log_ratio_abs_mean']:10.2e} {f['log_ratio_abs_p99']:8.4f} "
                  f"{f['log_ratio_abs_max']:8.4f} {f['tis_truncated_frac']:7.1%} {f['seq_masked_frac']:8.1%} "
                  f"{f'{min(loss):.4f}..{max(loss):.4f}':>20s} {f'{min(gn):.4f}..{max(gn):.4f}':>18s}")
        fig["gnorm_tampered_over_clean"] = max(t["grad_norm"] / c["grad_norm"]
                                               for t, c in zip(kinds["tampered"], kinds["clean"]))
        print(f"{v:12s} tampered/clean gradient norm: {fig['gnorm_tampered_over_clean']:.2f}x (worst batch)")
    bound = TIS_CAP * 1.0  # C · max|A|: advantages are +-1
    checks = {
        "bf16_mismatch_real": mismatch["mean"] > 1e-3,
        "tis_loss_bounded": all(out[v]["tampered"]["pg_loss_abs"][1] <= bound + 1e-6 for v in ("tis", "tis+seq")),
        "uncorrected_loss_unbounded": out["uncorrected"]["tampered"]["pg_loss_abs"][0] > bound,
        "seq_mask_hits_exactly_the_tampered": out["tis+seq"]["tampered"]["seq_masked"] == hits
        and out["tis+seq"]["clean"]["seq_masked"] == [0] * len(hits),
        "seq_mask_gnorm_bounded": out["tis+seq"]["gnorm_tampered_over_clean"] <= 1.5,
        "uncorrected_gnorm_blows_up": out["uncorrected"]["gnorm_tampered_over_clean"] > 3.0,
    }
    print("checks: " + ", ".join(f"{k} {'ok' if ok else 'FAILED'}" for k, ok in checks.items()))
    return {"bench": "rollout_correction", "model": a.model, "engine_dtype": a.engine_dtype,
            "trainer_dtype": "float32", "batches": a.batches, "prompts": a.prompts, "tokens": a.tokens,
            "tamper_nats": a.tamper, "logprob_mismatch": mismatch, "variants": out, "checks": checks,
            "target_met": all(checks.values())}


def parse(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="init:0.1", help="init:R (tiny-llama's shape, random init R) or a prepared model")
    ap.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="sequences per batch (an even number: groups of two)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--tamper", type=float, default=3.0, help="nats taken off the tampered sequences' logprobs")
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    result = run(parse(argv))
    print(json.dumps(result), flush=True)
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
