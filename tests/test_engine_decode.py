"""The preallocated decode KV (`engine.kv.BatchKV`) gives the outputs of the previous
concatenating layout (`ConcatKV`): identical greedy ids and logprobs (float32), identical
seeded samples, across staggered joins, rows leaving mid-batch, aborts, a retract/resume,
and runs long enough that the buffers grow; plus the buffers' own invariants (right-aligned
rows, mask views, columns written in place).

Both schedulers run the real tiny-llama model on this thread, stepped by hand, so the two
paths see the same sequence of joins and leaves.
"""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine.attention import use_gqa_sdpa
from harnessrl.trainers.engine.kv import BatchKV, ConcatKV, _room
from harnessrl.trainers.engine.protocol import SamplingParams
from harnessrl.trainers.engine.scheduler import Req, Scheduler
from harnessrl.trainers.engine.weights import eos_token_ids, load_model

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_tok():
    path = resolve_model("tiny-llama")
    model = load_model(path)
    assert use_gqa_sdpa(model)  # as the engine runs it on CPU
    return model, load_tokenizer(str(path))


def _sched(model_tok, preallocate: bool) -> Scheduler:
    model, tok = model_tok
    # HF's forward on both sides: this file is about the KV layout (the fast decode path on top
    # of BatchKV is compared with HF's forward in test_engine_fast_decode.py)
    return Scheduler(model, tok, eos_token_ids(model, tok), weight_version="v", max_running=16,
                     max_prefill_per_step=2, max_context=2048, kv_preallocate=preallocate, fast_decode=False)


def _req(rid: str, ids: list[int], n: int, **sp) -> Req:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True, **({"temperature": 0} | sp))
    gen = torch.Generator().manual_seed(sp["sampling_seed"]) if "sampling_seed" in sp else None
    return Req(rid=rid, input_ids=ids, params=params, sink=lambda d: None, generator=gen)


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": f"task {i}: " + "fix the bug, " * (i * 3)}],
                                    add_generation_prompt=True, return_dict=False) for i in range(n)]


def _drive(s: Scheduler, schedule: dict[int, list[Req]], aborts: dict[int, str], retract_at: int | None,
           steps: int) -> None:
    """Step `s` by hand: at step t submit schedule[t], abort aborts[t], retract at retract_at."""
    torch.set_grad_enabled(False)
    for t in range(steps):
        for r in schedule.get(t, []):
            s.submit(r)
        if t in aborts:
            s.abort(aborts[t])
        if t == retract_at:
            s.pause("retract")
            s.resume()
        s._apply_aborts()
        s._admit()
        if s._running:
            s._decode_step()
    torch.set_grad_enabled(True)


def _scenario(tok):
    ps = _prompts(tok, 7)
    return {
        0: [_req("a", ps[0], 40), _req("b", ps[3], 9)],
        2: [_req("c", ps[6], 70, temperature=0.8, sampling_seed=7)],
        5: [_req("d", ps[1], 30, temperature=1.0, top_p=0.9, sampling_seed=3), _req("e", ps[5], 4)],
        20: [_req("f", ps[2], 80), _req("g", ps[4], 25, temperature=0.7, top_k=20, sampling_seed=11)],
    }


def _outputs(schedule) -> dict[str, tuple[list[int], list[float], dict | None]]:
    return {r.rid: (r.output_ids, r.logprobs, r.finish) for reqs in schedule.values() for r in reqs}


def test_preallocated_equals_concat_across_joins_leaves_aborts_retract(model_tok):
    tok = model_tok[1]
    runs = {}
    for pre in (True, False):
        sched = _scenario(tok)
        _drive(_sched(model_tok, pre), sched, aborts={12: "d"}, retract_at=30, steps=115)
        runs[pre] = _outputs(sched)
    new, old = runs[True], runs[False]
    assert set(new) == set("abcdefg")
    for rid in new:
        assert new[rid][0] == old[rid][0], rid  # token ids identical
        assert new[rid][1] == pytest.approx(old[rid][1], abs=1e-5), rid
        assert new[rid][2] == old[rid][2], rid
    assert new["d"][2]["type"] == "abort" and len(new["d"][0]) < 30
    assert len(new["f"][0]) == 80 and new["f"][2] == {"type": "length", "length": 80}


def test_greedy_equals_hf_generate_past_the_preallocated_room(model_tok):
    """One row decoding past its buffer room (growth in place) matches HF generate (stock
    sdpa attention, a separately loaded copy) exactly."""
    tok = model_tok[1]
    model = load_model(resolve_model("tiny-llama"))
    p = _prompts(tok, 3)[2]
    n = _room(len(p)) - len(p) + 20  # grows once mid-way
    s = _sched(model_tok, True)
    r = _req("x", p, n)
    _drive(s, {0: [r]}, {}, None, n + 2)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=2)[0, len(p):]
        logits = model(torch.tensor([p + r.output_ids])).logits[0, len(p) - 1:-1]
    assert r.output_ids == ref.tolist()
    ref_lp = torch.log_softmax(logits, -1).gather(1, ref[:, None])[:, 0].tolist()
    assert r.logprobs == pytest.approx(ref_lp, abs=1e-5)


def _row_cache(n: int, fill: float, layers: int = 2) -> DynamicCache:
    kv = [(torch.full((1, 2, n, 3), fill) + torch.arange(n).view(1, 1, n, 1),
           -torch.full((1, 2, n, 3), fill) - torch.arange(n).view(1, 1, n, 1)) for _ in range(layers)]
    return DynamicCache(ddp_cache_data=kv)


def test_buffers_right_aligned_views_and_written_in_place():
    new, old = BatchKV(), ConcatKV()
    for kv in (new, old):
        kv.add(_row_cache(3, 10.0))
        kv.add(_row_cache(5, 20.0))
    assert new.mask.tolist() == old.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert new.lengths.tolist() == [3, 5]
    for ln, lo in zip(new.cache.layers, old.cache.layers):
        assert torch.equal(ln.keys, lo.keys) and torch.equal(ln.values, lo.values)
        assert ln.k_buf.shape[2] == _room(5) and ln.keys.data_ptr() == ln.k_buf.data_ptr()
    si_new, si_old = new.step_inputs(), old.step_inputs()
    assert torch.equal(si_new["attention_mask"], si_old["attention_mask"])
    assert si_new["position_ids"].tolist() == si_old["position_ids"].tolist() == [[3], [5]]
    assert si_new["cache_position"].tolist() == si_old["cache_position"].tolist() == [5]
    assert new.mask.tolist() == old.mask.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    buf = new.cache.layers[0].k_buf
    col = torch.full((2, 2, 1, 3), 7.0)
    keys, _ = new.cache.layers[0].update(col, -col)
    assert new.cache.layers[0].k_buf is buf and keys.shape[2] == 6 and torch.equal(keys[:, :, 5:], col)
    new.cache.layers[1].update(col, -col)
    new.keep([0])  # the longer row leaves: the two padding columns of row 0 are trimmed
    assert new.lengths.tolist() == [4] and new.mask.tolist() == [[1, 1, 1, 1]]
    assert new.cache.layers[0].keys[0, 0, :, 0].tolist() == [10.0, 11.0, 12.0, 7.0]
    assert new.step_inputs()["attention_mask"] is None  # no padding left: HF's unbatched path
    new.keep([])
    assert new.cache is None and new.size == 0
