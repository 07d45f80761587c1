"""Packed prefill (`engine.packed_prefill`): requests admitted together and prefilled in one
forward give what prefilling each alone gives (identical greedy ids and seeded samples,
logprobs within 2e-5 in float32: the matmuls over more rows round differently, by the
same order as HF's own forward differs from a float64 one), in one forward; requests that
must be prefilled alone (a prefix-cache hit, a long prompt, input logprobs) keep their
admission order; and the block-diagonal mask is what it says.

Real tiny-llama, schedulers stepped by hand on this thread.
"""
from __future__ import annotations

import pytest
import torch

from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine.attention import use_gqa_sdpa
from harnessrl.trainers.engine.packed_prefill import MAX_PROMPT, block_causal_mask
from harnessrl.trainers.engine.protocol import SamplingParams
from harnessrl.trainers.engine.scheduler import Req, Scheduler
from harnessrl.trainers.engine.weights import eos_token_ids, load_model

pytestmark = pytest.mark.timeout(600)
TOL = 2e-5


@pytest.fixture(scope="module")
def tiny():
    path = resolve_model("tiny-llama")
    model = load_model(path)
    assert use_gqa_sdpa(model)
    return model, load_tokenizer(str(path))


class _CountingForward:
    """Records the tokens of each prefill forward of the model (decode steps feed 1 token per
    row and are left out; the real forward runs)."""

    def __init__(self, model):
        self.model, self.inner, self.tokens = model, model.forward, []

    def __enter__(self):
        def counted(*a, **k):
            if k["input_ids"].shape[1] > 1:
                self.tokens.append(int(k["input_ids"].shape[1]))
            return self.inner(*a, **k)
        self.model.forward = counted
        return self

    def __exit__(self, *exc):
        self.model.forward = self.inner


def _req(rid: str, ids: list[int], n: int, **extra) -> Req:
    sp = {k: extra.pop(k) for k in list(extra) if k != "logprob_start_len"}
    gen = torch.Generator().manual_seed(sp["sampling_seed"]) if "sampling_seed" in sp else None
    params = SamplingParams(max_new_tokens=n, ignore_eos=True, **({"temperature": 0} | sp))
    return Req(rid=rid, input_ids=ids, params=params, sink=lambda d: None, generator=gen, **extra)


def _run(model, tok, reqs: list[Req], max_prefill: int, cache_mb: int = 0, warm: list[Req] = ()) -> Scheduler:
    # HF's forward for every decode step (as `fast_decode=False`): only the prefill differs
    s = Scheduler(model, tok, eos_token_ids(model, tok), weight_version="v", max_running=32,
                  max_prefill_per_step=max_prefill, max_context=4096, prefix_cache_bytes=cache_mb << 20,
                  fast_decode=False)
    with torch.no_grad():
        for group in (warm, reqs):  # the warm-up ones finish first (they fill the prefix cache)
            for r in group:
                s.submit(r)
            while s._running or s._waiting:
                s._admit()
                if s._running:
                    s._decode_step()
    return s


NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def _prompts(tok, n: int, words: int = 3) -> list[list[int]]:
    """Prompts that share no first token (so none is a prefix-cache hit of another)."""
    return [tok.encode(f"{NAMES[i % len(NAMES)]} task {i}: " + "fix the bug, " * (i * words), add_special_tokens=False)
            for i in range(n)]


def _same(a: list[Req], b: list[Req]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.output_ids == y.output_ids, x.rid
        assert x.logprobs == pytest.approx(y.logprobs, abs=TOL), x.rid
        assert x.finish == y.finish, x.rid


def test_packed_equals_alone_in_one_forward(tiny):
    model, tok = tiny
    ps = _prompts(tok, 8)
    make = lambda: [_req(str(i), p, 12) if i % 2 else _req(str(i), p, 12, temperature=0.9, sampling_seed=i)
                    for i, p in enumerate(ps)]
    packed, alone = make(), make()
    with _CountingForward(model) as fwd:
        _run(model, tok, packed, max_prefill=8)
    assert fwd.tokens == [sum(map(len, ps))]  # the eight prompts in one forward
    with _CountingForward(model) as fwd:
        _run(model, tok, alone, max_prefill=1)
    assert fwd.tokens == [len(p) for p in ps]
    _same(packed, alone)


def test_hits_long_prompts_and_input_logprobs_are_prefilled_alone_in_order(tiny):
    model, tok = tiny
    ps = _prompts(tok, 4)
    long = tok.encode("echo: " + "fix the bug, " * 200, add_special_tokens=False)
    assert len(long) > MAX_PROMPT
    warm = lambda: [_req("warm", ps[1], 6)]

    def make():
        return [_req("a", ps[0], 8), _req("b", ps[2], 8),
                _req("hit", ps[1] + ps[3][1:], 8),  # starts like the warm-up request: a cache hit
                _req("c", ps[3], 8), _req("long", long, 8), _req("lp", ps[2], 8, logprob_start_len=0)]
    packed, alone = make(), make()
    with _CountingForward(model) as fwd:
        s = _run(model, tok, packed, max_prefill=8, cache_mb=256, warm=warm())
    hit_new = len(ps[1] + ps[3][1:]) - packed[2].cached_tokens
    # warm-up alone; then a+b packed, the hit's suffix alone, c alone (its forward would have
    # been packed, but the next one must go alone), long alone, lp alone: admission order kept
    assert fwd.tokens == [len(ps[1]), len(ps[0]) + len(ps[2]), hit_new, len(ps[3]), len(long), len(ps[2])]
    assert packed[2].cached_tokens > 0 and s.prefix_cache.stats["hits"] >= 1
    _run(model, tok, alone, max_prefill=1, cache_mb=256, warm=warm())
    _same(packed, alone)
    assert packed[5].input_logprobs == pytest.approx(alone[5].input_logprobs, abs=TOL)


def test_block_causal_mask_by_hand():
    m = block_causal_mask([2, 1, 2], torch.float32, "cpu")
    low = torch.finfo(torch.float32).min
    allowed = torch.tensor([[1, 0, 0, 0, 0],
                            [1, 1, 0, 0, 0],
                            [0, 0, 1, 0, 0],
                            [0, 0, 0, 1, 0],
                            [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert m.shape == (1, 1, 5, 5)
    assert torch.equal(m[0, 0], torch.where(allowed, torch.tensor(0.0), torch.tensor(low)))
