"""Speculative decoding by prompt lookup changes nothing but the tokens per pass.

Real SmolLM2-135M and its chat template; schedulers stepped by hand on this thread, one with
prompt lookup and one without, on the same requests. Every comparison is exact (`==` on ids,
logprobs and top lists): the verify pass must give each position's logits bit for bit, and
the sampler must draw as many times, in the same order, as plain decoding does.
"""
from __future__ import annotations

import pytest
import torch

from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine.fast_decode import FastDecoder
from harnessrl.trainers.engine.kv import BatchKV
from harnessrl.trainers.engine.protocol import SamplingParams
from harnessrl.trainers.engine.scheduler import Req, Scheduler
from harnessrl.trainers.engine.speculate import MAX_BONUS, PromptLookup
from harnessrl.trainers.engine.weights import apply_weights, eos_token_ids, load_model

pytestmark = pytest.mark.timeout(900)

CODE = '''def parse_config(path):
    with open(path) as f:
        lines = f.read().splitlines()
    config = {}
    for line in lines:
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config
'''


@pytest.fixture(scope="module")
def smol():
    path = resolve_model("smollm2-135m")
    return load_model(path), load_tokenizer(str(path))


def _sched(model, tok, ngram: int, **kw) -> Scheduler:
    return Scheduler(model, tok, eos_token_ids(model, tok), weight_version="v", max_running=4,
                     max_prefill_per_step=1, max_context=kw.pop("max_context", 4096), cpu_matvec="on",
                     prompt_lookup_ngram=ngram, **kw)


def _prompt(tok, ask: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "system", "content": "You are a careful coding assistant."},
         {"role": "user", "content": f"Here is utils.py:\n```python\n{CODE}```\n{ask}"}],
        add_generation_prompt=True, return_dict=False)


def _req(rid: str, ids: list[int], n: int, seed: int | None = None, **sp) -> Req:
    params = SamplingParams(max_new_tokens=n, **({"temperature": 0} | sp))
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return Req(rid=rid, input_ids=ids, params=params, sink=lambda d: None, generator=gen)


def _run(s: Scheduler, reqs: list[Req], retract_at: int | None = None, max_steps: int = 400) -> None:
    """Submit `reqs` one after the other (each once the previous finished) and step until done."""
    with torch.no_grad():
        for r in reqs:
            s.submit(r)
            for t in range(max_steps):
                if t == retract_at:
                    s.pause("retract")
                    s.resume()
                s._apply_aborts()
                s._admit()
                if not s._running:
                    break
                s._decode_step()
            assert r.finish is not None, r.rid


def _out(r: Req):
    return r.output_ids, r.logprobs, r.top_logprobs, r.finish


def _pair(smol, make, prefix_cache_bytes: int = 0, **kw):
    """The same requests (`make()` builds a fresh list) through a scheduler without and with
    prompt lookup (each with a prefix cache of `prefix_cache_bytes`, 0: none); returns both
    lists and the speculating scheduler."""
    model, tok = smol
    plain, spec = make(), make()
    _run(_sched(model, tok, 0, prefix_cache_bytes=prefix_cache_bytes), plain, **kw)
    s = _sched(model, tok, 6, prefix_cache_bytes=prefix_cache_bytes)
    _run(s, spec, **kw)
    return plain, spec, s


def test_greedy_and_sampled_outputs_are_identical_and_drafts_are_accepted(smol):
    _, tok = smol
    ask = _prompt(tok, "Copy parse_config exactly, then add a docstring to it.")

    def make():
        return [
            _req("greedy", ask, 80),
            # seeded: its own generator; top-p and top-k filter the drawn distribution
            _req("seeded", ask, 60, seed=7, temperature=0.8, top_p=0.95, top_k=50),
            # unseeded: the engine-wide generator, whose state after the first carries into the second
            _req("shared-1", ask, 40, temperature=1.0),
            _req("shared-2", ask, 40, temperature=0.7),
        ]

    plain, spec, s = _pair(smol, make)
    for a, b in zip(plain, spec):
        assert _out(a) == _out(b), a.rid
    assert len(plain[0].output_ids) == 80 or plain[0].finish["type"] == "stop"
    st = s.spec_stats
    # the copy was drafted and accepted: fewer passes than tokens
    assert st["verify_steps"] > 10 and st["accepted"] > 40, st
    assert st["tokens"] == st["verify_steps"] + st["accepted"]
    assert s.steps < sum(len(r.output_ids) for r in spec) - len(spec)


def test_top_logprobs_stop_strings_and_length_limits_are_identical(smol):
    _, tok = smol
    ask = _prompt(tok, "Copy parse_config exactly, then add a docstring to it.")

    def make():
        reqs = [
            Req(rid="top", input_ids=ask, params=SamplingParams(max_new_tokens=48, temperature=0),
                sink=lambda d: None, top_logprobs_num=5),
            # the stop string ends it mid-pass: what follows is never emitted
            Req(rid="stop", input_ids=ask, params=SamplingParams(max_new_tokens=200, temperature=0,
                                                                   stop=["config[key"]), sink=lambda d: None),
        ]
        # every length limit from 1 to 12: a pass must never emit past max_new_tokens
        reqs += [Req(rid=f"len{n}", input_ids=ask, params=SamplingParams(max_new_tokens=n, temperature=0,
                                                                         ignore_eos=True), sink=lambda d: None)
                 for n in range(1, 13)]
        return reqs

    # one prompt for all 14: after the first, each prefill is a prefix-cache hit on both sides
    plain, spec, s = _pair(smol, make, prefix_cache_bytes=256 << 20)
    for a, b in zip(plain, spec):
        assert _out(a) == _out(b), a.rid
    assert all(r.cached_tokens > 0 for r in spec[1:])
    top, stop = spec[0], spec[1]
    assert len(top.top_logprobs) == len(top.output_ids) and all(len(x) == 5 for x in top.top_logprobs)
    assert stop.finish == {"type": "stop", "matched": "config[key"}
    for n, r in enumerate(spec[2:], start=1):
        assert len(r.output_ids) == n and r.finish == {"type": "length", "length": n}
    assert s.spec_stats["accepted"] > 20


def test_retract_and_prefix_cache_reuse_after_speculative_steps(smol):
    """A retract mid-request recomputes the KV of what speculative steps emitted (the next pass
    continues from it); a finished
    request's KV (written by verify passes, rejected columns dropped) is kept in the prefix cache
    and serves the next turn, which must equal a cold run's next turn."""
    model, tok = smol
    ask = _prompt(tok, "Copy parse_config exactly, then add a docstring to it.")
    plain, spec = [_req("a", ask, 90)], [_req("a", ask, 90)]
    _run(_sched(model, tok, 0), plain, retract_at=25)
    s = _sched(model, tok, 6, prefix_cache_bytes=256 << 20)
    _run(s, spec, retract_at=25)
    # the 25th pass is past the 25th token: the KV recomputed on resume covers other positions
    # (a prefill's rounding, not a step's), so logprobs agree to rounding, ids exactly
    assert plain[0].output_ids == spec[0].output_ids and plain[0].finish == spec[0].finish
    assert plain[0].logprobs == pytest.approx(spec[0].logprobs, abs=1e-5)
    assert s.spec_stats["accepted"] > 10
    # next turn: the whole previous call + a new user message; the cache holds its KV
    turn2 = ask + spec[0].output_ids + tok.encode("\nNow add type hints.", add_special_tokens=False)
    cold, hot = _req("b", turn2, 60), _req("b", turn2, 60)
    _run(_sched(model, tok, 0), [cold])
    _run(s, [hot])
    assert hot.cached_tokens >= len(ask) + len(spec[0].output_ids) - 1
    assert hot.output_ids == cold.output_ids
    assert hot.logprobs == pytest.approx(cold.logprobs, abs=1e-5)  # cached KV vs a cold prefill: rounding only


def test_verify_rows_equal_one_row_steps_bit_for_bit_and_follow_new_weights(smol):
    """The kernel's contract, directly: a T-token verify returns, row by row, the logits of T
    one-token steps at the same positions; after weights change in place, it uses the new ones."""
    _, tok = smol
    model = load_model(resolve_model("smollm2-135m"))  # its own copy: the weights change below
    dec = FastDecoder(model, "on")
    ids = _prompt(tok, "Explain parse_config.")
    toks = tok.encode(CODE, add_special_tokens=False)[:9]
    for round_ in range(2):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        kv = BatchKV()
        kv.add(out.past_key_values)
        steps = [dec.step(torch.tensor([[t]]), kv)[0] for t in toks]
        kv.truncate(len(toks))
        rows = dec.verify(toks, kv)
        assert rows.shape == (len(toks), model.config.vocab_size)
        for t in range(len(toks)):
            assert torch.equal(rows[t], steps[t]), (round_, t)
        # after a partial accept the next pass continues from the kept columns
        kv.truncate(len(toks) - 3)
        again = dec.verify(toks[3:6], kv)
        for t in range(3):
            assert torch.equal(again[t], steps[3 + t]), (round_, t)
        if round_ == 0:
            g = torch.Generator().manual_seed(0)
            apply_weights(model, {k: v + 0.05 * torch.randn(v.shape, generator=g) * v.std()
                                  for k, v in model.state_dict().items() if k.endswith("proj.weight")})
            before = rows
    assert not torch.equal(before, rows)  # the second round ran on the new weights


def test_prompt_lookup_drafts_from_the_latest_longest_match():
    p = PromptLookup(max_ngram=4, min_ngram=2)
    prompt = [1, 2, 3, 4, 5, 9]
    assert p.draft(prompt, [1, 2, 3], 8) == [4, 5]  # tail (1, 2, 3) matched: n - 1 = 2 tokens of what followed
    assert p.draft(prompt, [1, 2, 3, 4], 8) == [5, 9, 1]  # grown: a 4-gram match, 3 tokens
    assert p.draft(prompt, [1, 2, 3, 4], 1) == [5]  # the caller's room caps it
    assert p.draft(prompt, [1, 2, 3, 4], 0) == []
    assert p.draft([1, 2, 7, 1, 2, 8], [1, 2], 8) == [8]  # the latest occurrence wins
    assert p.draft([5, 6, 7], [8], 8) == []  # no earlier occurrence
    assert p.draft([7, 7, 7], [7], 8) == [7]  # a different sequence: the index starts over
    # the index follows the request's output as it grows, and starts over when it is not a growth
    # of what it indexed (a shorter output, or a different last token at the same length)
    r = PromptLookup(max_ngram=3, min_ngram=2)
    out: list[int] = []
    prompt = [10, 11, 12, 13, 14]
    for t, want in [(10, []), (11, [12]), (12, [13, 14])]:
        out.append(t)
        assert r.draft(prompt, out, 8) == want
    assert r.draft(prompt, [10, 11, 99], 8) == []  # same length, another last token: re-indexed
    assert r.draft(prompt, [10], 8) == []  # shorter output
    assert r.draft(prompt, [10, 11], 8) == [12]
    # whole accepts lengthen the next drafts (by GROW, up to MAX_BONUS); a rejection resets them
    q = PromptLookup(max_ngram=3, min_ngram=2)
    long_prompt = list(range(40))
    assert q.draft(long_prompt, [0, 1, 2], 30) == [3, 4]
    q.feedback(2, 2)
    assert q.draft(long_prompt, [0, 1, 2], 30) == [3, 4, 5, 6]
    for _ in range(10):
        q.feedback(4, 4)
    assert q.draft(long_prompt, [0, 1, 2], 30) == list(range(3, 3 + 2 + MAX_BONUS))
    q.feedback(12, 5)
    assert q.draft(long_prompt, [0, 1, 2], 30) == [3, 4]
    with pytest.raises(ValueError):
        PromptLookup(max_ngram=1, min_ngram=2)


def test_engine_over_http_speculates_by_default_and_answers_as_without(smol):
    """The served engine (its config's default lookup, the C step on): /generate gives exactly
    the ids and logprobs of an engine with lookup off, and streamed the same chunks (one per
    token), and the counters in /get_model_info show
    the passes it saved."""
    import json

    import httpx

    from harnessrl.trainers.engine import EngineServer

    _, tok = smol
    ask = _prompt(tok, "Copy parse_config exactly, then add a docstring to it.")
    body = {"input_ids": ask, "return_logprob": True, "sampling_params": {"max_new_tokens": 48, "temperature": 0}}
    with EngineServer(model="smollm2-135m", cpu_matvec="on") as on, \
            EngineServer(model="smollm2-135m", cpu_matvec="on", prompt_lookup_ngram=0) as off:
        outs = {}
        for name, srv in (("on", on), ("off", off)):
            r = httpx.post(srv.url + "/generate", json=body, timeout=300)
            assert r.status_code == 200, r.text
            outs[name] = r.json()["meta_info"]["output_token_logprobs"]
            # streamed: still one chunk per token (incremental output), the same tokens
            with httpx.stream("POST", srv.url + "/generate", json=body | {"stream": True}, timeout=300) as s:
                lines = [ln for ln in s.iter_lines() if ln.startswith("data:") and ln != "data: [DONE]"]
            outs[name + "_chunks"] = [json.loads(ln[5:])["output_ids"] for ln in lines]
            stats = httpx.get(srv.url + "/get_model_info", timeout=30).json()["speculative"]
            outs[name + "_stats"] = stats
    assert outs["on"] == outs["off"] and len(outs["on"]) > 20
    ids = [e[1] for e in outs["on"]]
    assert outs["on_chunks"] == outs["off_chunks"]
    assert len(outs["on_chunks"]) == len(ids) and outs["on_chunks"][-1] == ids  # cumulative, one per token
    assert outs["on_stats"]["verify_steps"] > 0 and outs["on_stats"]["accepted"] > 10
    assert outs["off_stats"] == {"verify_steps": 0, "drafted": 0, "accepted": 0, "tokens": 0}
