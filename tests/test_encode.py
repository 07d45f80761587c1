"""The one SGLang reply encoder (`gym/backends/encode.py`) and the servers that use it.

Each expected body below is the literal dict the server wrote by hand before it went
through the encoder (scripted policy, stand-in engine, gym env bridge), so a change to the
wire shape shows here as a diff. The stand-in's one difference: its bodies now carry
`cached_tokens: 0` like every other server's (the client reads no such field). The parsed
side is checked with the client's own readers (`gym/backends/engine_client.py`).
"""
from __future__ import annotations

import math

import pytest

from harnessrl.gym.backends.encode import finish_reason, sglang_reply
from harnessrl.gym.backends.engine_client import _finish_reason, _ids_and_logprobs


def test_finish_reason_kinds():
    assert finish_reason(None) is None
    assert finish_reason("") is None
    assert finish_reason("stop") == {"type": "stop"}
    assert finish_reason("stop", matched=2) == {"type": "stop", "matched": 2}
    assert finish_reason("stop", matched="</s>") == {"type": "stop", "matched": "</s>"}
    assert finish_reason("stop", length=9) == {"type": "stop"}  # length belongs to "length" only
    assert finish_reason("length", length=9) == {"type": "length", "length": 9}
    assert finish_reason("length", matched=2) == {"type": "length"}  # matched belongs to "stop" only
    assert finish_reason("abort") == {"type": "abort"}


def test_stop_with_matched_token():
    body = sglang_reply(rid="r1", output_ids=[5, 6, 2], logprobs=[-0.5, -0.25, -0.125],
                        finish=finish_reason("stop", matched=2), prompt_tokens=4, weight_version="3", text="hi")
    assert body == {"text": "hi", "output_ids": [5, 6, 2], "meta_info": {
        "id": "r1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 4,
        "completion_tokens": 3, "cached_tokens": 0, "weight_version": "3",
        "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None], [-0.125, 2, None]]}}
    assert _finish_reason(body["meta_info"]) == "stop"
    assert _ids_and_logprobs(body) == ([5, 6, 2], [-0.5, -0.25, -0.125])


def test_length_from_a_bare_kind_counts_the_output():
    body = sglang_reply(rid="r2", output_ids=[7, 8], logprobs=[-1.0, -2.0], finish="length",
                        prompt_tokens=10, weight_version="0")
    assert body == {"text": "", "output_ids": [7, 8], "meta_info": {
        "id": "r2", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 10,
        "completion_tokens": 2, "cached_tokens": 0, "weight_version": "0",
        "output_token_logprobs": [[-1.0, 7, None], [-2.0, 8, None]]}}


def test_abort_keeps_the_partial_output():
    body = sglang_reply(rid="r3", output_ids=[9], logprobs=[-0.75], finish="abort", prompt_tokens=1,
                        weight_version="5")
    assert body["meta_info"]["finish_reason"] == {"type": "abort"}
    assert body["output_ids"] == [9] and body["meta_info"]["completion_tokens"] == 1
    assert _finish_reason(body["meta_info"]) == "abort"


def test_unfinished_stream_chunk_counts_all_tokens_so_far():
    """An incremental chunk: two new ids, nine tokens generated in all, finish still null."""
    body = sglang_reply(rid="r4", output_ids=[11, 12], logprobs=[-0.07, -0.08], finish=None,
                        prompt_tokens=3, completion_tokens=9, weight_version="1")
    assert body == {"text": "", "output_ids": [11, 12], "meta_info": {
        "id": "r4", "finish_reason": None, "prompt_tokens": 3, "completion_tokens": 9,
        "cached_tokens": 0, "weight_version": "1",
        "output_token_logprobs": [[-0.07, 11, None], [-0.08, 12, None]]}}
    assert _finish_reason(body["meta_info"]) == ""


def test_logprobs_none_omits_the_field_and_none_entries_stay_null():
    body = sglang_reply(rid="r5", output_ids=[3, 4], logprobs=None, finish="stop", prompt_tokens=2,
                        weight_version="v")
    assert "output_token_logprobs" not in body["meta_info"]
    assert _ids_and_logprobs(body) == ([3, 4], [])  # the client falls back to output_ids
    body = sglang_reply(rid="r5", output_ids=[3, 4], logprobs=[None, None], finish="stop", prompt_tokens=2,
                        weight_version="v")
    assert body["meta_info"]["output_token_logprobs"] == [[None, 3, None], [None, 4, None]]
    ids, lps = _ids_and_logprobs(body)
    assert ids == [3, 4] and all(math.isnan(x) for x in lps)


def test_token_texts_cached_tokens_and_extra_meta():
    body = sglang_reply(rid="r6", output_ids=[1, 2], logprobs=[-0.5, -0.5], finish="stop", prompt_tokens=8,
                        weight_version="2", token_texts=["a", None], cached_tokens=6, e2e_latency=0.25)
    assert body["meta_info"]["output_token_logprobs"] == [[-0.5, 1, "a"], [-0.5, 2, None]]
    assert body["meta_info"]["cached_tokens"] == 6 and body["meta_info"]["e2e_latency"] == 0.25


# -- the servers that used to write these bodies by hand -------------------------------------


@pytest.fixture(scope="module")
def tok():
    from harnessrl.gym.models import load_tokenizer

    return load_tokenizer("tiny-llama")


def test_scripted_engine_bodies(tok):
    from harnessrl.gym.doubles.scripted import ScriptedEngine

    eng = ScriptedEngine(tok, weight_version="w1", logprob=-0.125)
    ids = tok.encode("hi there", add_special_tokens=False) + [eng.eos_id]
    assert ids == [6004, 665, 2]
    assert eng._body([1, 2, 3, 4], ids, "stop", "rid") == {
        "text": "hi there", "output_ids": [6004, 665, 2],
        "meta_info": {"id": "rid", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 4,
                      "completion_tokens": 3, "cached_tokens": 0, "weight_version": "w1",
                      "output_token_logprobs": [[-0.125, 6004, None], [-0.125, 665, None], [-0.125, 2, None]]}}
    assert eng._body([1], ids[:2], "length", "rid")["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    chunk = eng._body([1], ids[:1], None, "rid")  # a cumulative stream chunk
    assert chunk["meta_info"]["finish_reason"] is None and chunk["meta_info"]["completion_tokens"] == 1
    assert chunk["text"] == "hi"


def test_standin_engine_bodies():
    from harnessrl.gym.doubles.standin import StandinEngine

    eng = StandinEngine(weight_version="4")
    req = {"rid": "s1", "input_ids": [10, 11, 12], "_version": "3"}
    # non-streamed: all ids, logprobs from position 0
    assert eng._body(req, [100, 2], 0, "stop", 2) == {"text": "", "output_ids": [100, 2], "meta_info": {
        "id": "s1", "prompt_tokens": 3, "completion_tokens": 2, "finish_reason": {"type": "stop"},
        "cached_tokens": 0, "weight_version": "3", "output_token_logprobs": [[-0.01, 100, None], [-0.02, 2, None]]}}
    # incremental chunk: the 6th token alone, its logprob by position, still running
    assert eng._body(req, [105], 5, "", 6) == {"text": "", "output_ids": [105], "meta_info": {
        "id": "s1", "prompt_tokens": 3, "completion_tokens": 6, "finish_reason": None,
        "cached_tokens": 0, "weight_version": "3", "output_token_logprobs": [[-0.06, 105, None]]}}
    # bare finish kinds: no matched token, no length (as before)
    assert eng._body(req, [], 0, "length", 4)["meta_info"]["finish_reason"] == {"type": "length"}
    no_rid = eng._body({"input_ids": [1]}, [], 0, "abort", 0)
    assert no_rid["meta_info"]["finish_reason"] == {"type": "abort"}
    assert no_rid["meta_info"]["id"] == "" and no_rid["meta_info"]["weight_version"] == "4"
    assert no_rid["meta_info"]["output_token_logprobs"] == []


def test_env_bridge_bodies():
    from harnessrl.gym.envs.env_bridge import BridgeEngine

    eng = BridgeEngine(stop_ids=[2], version=lambda: 7)
    assert eng._reply([1, 2, 3], [40, 41, 2], "stop", "b1") == {"text": "", "output_ids": [40, 41, 2], "meta_info": {
        "id": "b1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
        "completion_tokens": 3, "cached_tokens": 0, "weight_version": "7",
        "output_token_logprobs": [[None, 40, None], [None, 41, None], [None, 2, None]]}}
    # a completion that does not end with a stop id still stops, naming nothing
    assert eng._reply([1], [40, 41], "stop", "b2")["meta_info"]["finish_reason"] == {"type": "stop"}
    assert eng._reply([1], [], "stop", "b3")["meta_info"]["finish_reason"] == {"type": "stop"}
    assert eng._reply([1], [40, 2], "length", "b4")["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
