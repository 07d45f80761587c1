"""`engine.fast_decode.FastDecoder` gives HF's forward's outputs: identical greedy ids, logprobs
within float32 rounding (`TOL`) and identical seeded samples across joins, leaves, an abort and a
retract, with the batch crossing the small-batch threshold both ways; it follows weights
changed in place (never decodes with stale copies); and it declines models it does not fit.

Real tiny-llama and SmolLM2-135M, schedulers stepped by hand on this thread.
"""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine import cpu_matvec, fast_decode
from harnessrl.trainers.engine.attention import use_gqa_sdpa
from harnessrl.trainers.engine.fast_decode import FastDecoder
from harnessrl.trainers.engine.protocol import SamplingParams
from harnessrl.trainers.engine.scheduler import Req, Scheduler
from harnessrl.trainers.engine.weights import apply_weights, eos_token_ids, load_model

pytestmark = pytest.mark.timeout(600)
TOL = {"abs": 1e-5, "rel": 5e-6}
"""Logprobs agree within 1e-5, or 5e-6 of their size for unlikely tokens (a -10.9 logprob was
measured 1.9e-5 away: float32 rounding of the logits, ~2e-6 relative; against a float64 forward
the fast path errs as much as HF's own)."""


def _load(name: str):
    path = resolve_model(name)
    model = load_model(path)
    assert use_gqa_sdpa(model)  # as the engine runs it on CPU
    return model, load_tokenizer(str(path))


@pytest.fixture(scope="module")
def tiny():
    return _load("tiny-llama")


def _sched(model, tok, fast: bool, max_running: int = 16, matvec: str = "auto") -> Scheduler:
    return Scheduler(model, tok, eos_token_ids(model, tok), weight_version="v", max_running=max_running,
                     max_prefill_per_step=2, max_context=4096, fast_decode=fast, cpu_matvec=matvec)


def _req(rid: str, ids: list[int], n: int, **sp) -> Req:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True, **({"temperature": 0} | sp))
    gen = torch.Generator().manual_seed(sp["sampling_seed"]) if "sampling_seed" in sp else None
    return Req(rid=rid, input_ids=ids, params=params, sink=lambda d: None, generator=gen)


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": f"task {i}: " + "fix the bug, " * (i * 3)}],
                                    add_generation_prompt=True, return_dict=False) for i in range(n)]


def _drive(s: Scheduler, schedule: dict[int, list[Req]], steps: int, abort: tuple[int, str] | None = None,
           retract_at: int | None = None) -> list[int]:
    """Step `s` by hand; returns the batch size of every decode step."""
    sizes = []
    with torch.no_grad():
        for t in range(steps):
            for r in schedule.get(t, []):
                s.submit(r)
            if abort and t == abort[0]:
                s.abort(abort[1])
            if t == retract_at:
                s.pause("retract")
                s.resume()
            s._apply_aborts()
            s._admit()
            if s._running:
                sizes.append(len(s._running))
                s._decode_step()
    return sizes


def _scenario(tok) -> dict[int, list[Req]]:
    ps = _prompts(tok, 7)
    return {
        0: [_req("a", ps[0], 60)],  # alone: the small-batch path
        6: [_req("b", ps[3], 9), _req("c", ps[6], 70, temperature=0.8, sampling_seed=7)],
        9: [_req("d", ps[1], 30, temperature=1.0, top_p=0.9, sampling_seed=3), _req("e", ps[5], 4)],
        12: [_req("f", ps[2], 80), _req("g", ps[4], 25, temperature=0.7, top_k=20, sampling_seed=11)],
    }


@pytest.mark.parametrize("matvec", ["on", "off"])
def test_fast_equals_hf_forward_across_joins_leaves_aborts_retract(tiny, matvec):
    """With the compiled kernel ("on": every step of up to C_ROWS rows, padded batches of rows at
    different lengths among them) and without it (MKL's products)."""
    model, tok = tiny
    runs, sizes = {}, {}
    for fast in (True, False):
        sched = _scenario(tok)
        s = _sched(model, tok, fast, matvec=matvec)
        assert (s._fast is not None) == fast
        if fast:
            assert s._fast.uses_c_step(1) == s._fast.uses_c_step(fast_decode.C_ROWS) == (matvec == "on")
            assert not s._fast.uses_c_step(fast_decode.C_ROWS + 1)
        sizes[fast] = _drive(s, sched, steps=130, abort=(20, "d"), retract_at=40)
        runs[fast] = {r.rid: (r.output_ids, r.logprobs, r.finish) for reqs in sched.values() for r in reqs}
        if fast:  # the steps of up to C_ROWS rows (padded ones among them) ran whole in C with the kernel on
            small = sum(1 for n in sizes[True] if n <= fast_decode.C_ROWS)
            assert (s._fast.c_steps == small) if matvec == "on" else s._fast.c_steps == 0
    # the batch went above the small-batch threshold and back below it
    assert sizes[True] == sizes[False]
    assert max(sizes[True]) > fast_decode.SMALL_BATCH and min(sizes[True][-10:]) <= fast_decode.SMALL_BATCH
    new, ref = runs[True], runs[False]
    assert set(new) == set("abcdefg")
    for rid in new:
        assert new[rid][0] == ref[rid][0], rid
        assert new[rid][1] == pytest.approx(ref[rid][1], **TOL), rid
        assert new[rid][2] == ref[rid][2], rid
    assert new["d"][2]["type"] == "abort" and len(new["d"][0]) < 30
    assert new["f"][2] == {"type": "length", "length": 80}


@pytest.mark.parametrize("matvec", ["on", "off"])
def test_smollm2_batch1_greedy_equals_hf_generate(matvec):
    model, tok = _load("smollm2-135m")
    p = _prompts(tok, 3)[2]
    s = _sched(model, tok, True, matvec=matvec)
    assert s._fast.uses_c_step(1) == (matvec == "on")
    r = _req("x", p, 48)
    _drive(s, {0: [r]}, 50)
    ref_model = load_model(resolve_model("smollm2-135m"))  # stock HF sdpa, its own copy
    with torch.no_grad():
        ref = ref_model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=48, min_new_tokens=48, pad_token_id=2)[0, len(p):]
    assert r.output_ids == ref.tolist()
    hf = _sched(ref_model, tok, False)
    r2 = _req("y", p, 48)
    _drive(hf, {0: [r2]}, 50)
    assert r2.output_ids == r.output_ids
    assert r.logprobs == pytest.approx(r2.logprobs, **TOL)
    assert (s._fast.c_steps > 40) == (matvec == "on")  # "on": the steps ran whole in C


@pytest.mark.parametrize("matvec", ["on", "off"])
def test_copies_follow_weights_changed_in_place(tiny, matvec):
    """A weight update copies into the parameters (`apply_weights`); the next fast step uses the
    new weights: it matches HF's forward on the new weights and moved away from the old outputs.
    "on": the steps run whole in C, which re-binds to the rebuilt copies."""
    model, tok = _load("tiny-llama")  # its own copy: this test changes the weights
    p = _prompts(tok, 2)[1]
    s = _sched(model, tok, True, matvec=matvec)
    before = _req("before", p, 20)
    _drive(s, {0: [before]}, 22)
    g = torch.Generator().manual_seed(0)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=g) * v.std()
             for k, v in model.state_dict().items() if k.endswith("proj.weight") or k == "lm_head.weight"}
    apply_weights(model, state)  # in place; nothing tells the fast decoder
    after, ref = _req("after", p, 20), _req("ref", p, 20)
    _drive(s, {0: [after]}, 22)
    _drive(_sched(model, tok, False), {0: [ref]}, 22)
    assert (s._fast.c_steps >= 38) == (matvec == "on") and s._fast.generation == 2
    assert after.output_ids == ref.output_ids
    assert after.logprobs == pytest.approx(ref.logprobs, **TOL)
    # the update moved the outputs (tiny-llama's greedy ids may stay; its logprobs do not)
    assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) > 1e-3


def test_declines_models_it_does_not_fit(tiny):
    model, tok = tiny
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, attention_bias=True)
    assert FastDecoder.build(LlamaForCausalLM(cfg)) is None  # biases: HF's forward decodes it
    assert FastDecoder.build(model) is not None
    assert Scheduler(model, tok, set(), weight_version="v", max_running=1, max_prefill_per_step=1,
                     max_context=64, kv_preallocate=False)._fast is None  # needs the preallocated KV


def test_matvec_kernel_rounds_as_well_as_mkl_and_rejects_bad_input(tmp_path, monkeypatch):
    """The compiled kernel is built here (a fresh kernels folder), multiplies SmolLM2's shapes and
    a chunkless one (k not a multiple of CHUNK) within float32 rounding of a float64 product, no
    worse than `_mm` and `F.linear`, and refuses what it cannot multiply."""
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    cpu_matvec.load.cache_clear()
    try:
        fn = cpu_matvec.load()
        assert fn is not None, "the image has a C compiler: the kernel must build"
        assert len(list((tmp_path / "kernels").glob("matvec-*.so"))) == 1
        mv = cpu_matvec.MatVec(fn)
        g = torch.Generator().manual_seed(0)
        for k, n in [(576, 960), (1536, 576), (576, 49152), (100, 37)]:
            w = torch.randn(n, k, generator=g)  # [out, in], as a model holds it
            x = torch.randn(1, 1, k, generator=g)
            wt = fast_decode._chunked(w)
            ref = (x.double() @ w.double().t()).view(-1)
            got = mv(x, wt).view(-1)
            err = float((got.double() - ref).abs().max())
            worst = max(float((fast_decode._mm(x, wt).view(-1).double() - ref).abs().max()),
                        float((torch.nn.functional.linear(x, w).view(-1).double() - ref).abs().max()))
            assert err <= worst * 1.25 and err < 1e-4 * float(ref.abs().max()), (k, n, err, worst)
            assert torch.allclose(got, fast_decode._mm(x, wt).view(-1), rtol=1e-5, atol=1e-4)
        with pytest.raises(ValueError, match="float32 x of 576"):
            mv(torch.randn(1, 1, 575), fast_decode._chunked(torch.randn(8, 576)))
        with pytest.raises(ValueError, match="float32"):
            mv(torch.randn(1, 1, 64, dtype=torch.float64), fast_decode._chunked(torch.randn(8, 64)))
        with pytest.raises(ValueError, match="contiguous"):
            mv(torch.randn(1, 1, 8), torch.randn(16, 8).t())
        monkeypatch.setenv("HARNESSRL_CPU_MATVEC", "0")
        cpu_matvec.load.cache_clear()
        assert cpu_matvec.load() is None
    finally:
        cpu_matvec.load.cache_clear()


def test_vectorized_attention_equals_the_scalar_loops_bit_for_bit(tiny, monkeypatch):
    """The C step's attention takes 16 positions' scores at once and holds its weighted sums in
    registers; built with -DHARNESSRL_SCALAR_ATTENTION it runs the plain loops. The scenario's
    joins, leaves, abort and retract (rows at lengths that fill 16-position blocks and end
    inside them; greedy and seeded samples) give the same ids and the same logprobs bit for bit."""
    model, tok = tiny
    scalar = cpu_matvec.load(("HARNESSRL_SCALAR_ATTENTION",))
    vector = cpu_matvec.load()
    assert scalar is not None and vector is not None and scalar is not vector
    runs = {}
    for name, lib in (("vector", vector), ("scalar", scalar)):
        monkeypatch.setattr(cpu_matvec, "load", lambda defines=(), lib=lib: lib)
        sched = _scenario(tok)
        s = _sched(model, tok, True, matvec="on")
        sizes = _drive(s, sched, steps=130, abort=(20, "d"), retract_at=40)
        assert s._fast.c_steps == sum(1 for n in sizes if n <= fast_decode.C_ROWS) > 80  # those ran in C
        runs[name] = {r.rid: (r.output_ids, r.logprobs, r.finish) for reqs in sched.values() for r in reqs}
    assert runs["vector"] == runs["scalar"]  # ids, logprobs (float ==) and finish reasons
    lengths = [len(v[0]) for v in runs["vector"].values()]
    assert sum(lengths) > 250 and any(n >= 60 for n in lengths)
