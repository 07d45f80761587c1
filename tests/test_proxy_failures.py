"""Engine failures and lost replies, through the proxy over real HTTP.

- A real local engine process (`python -m harnessrl.trainers.engine`, tiny-llama) stopped
  with SIGSTOP: plain and streamed calls (buffered and relayed) fail with a 504 in the
  dialect's shape once `engine_*_timeout_s` passes, and each failed call is recorded
  detached (`finish_reason` "engine_error", `flags["engine_error"]`), so the episode runner
  sees it; after SIGCONT the same session goes on in the same segment; a killed engine
  gives a recorded 503.
- A reply whose client gave up (plain call, or a stream closed before its final event) is
  recorded `undelivered`, extends no segment, and no trainer sample holds its tokens.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, post, sse_events, standin

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture()
def engine_proc():
    """The local engine as its own process (so it can be stopped with SIGSTOP)."""
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl.trainers.engine", "--model", "tiny-llama",
                             "--port", "0", "--num-threads", "1"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        m = re.search(r"on (http://[\d.]+:\d+)", line)
        assert m, f"engine did not start: {line!r}"
        yield proc, m.group(1)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(30)


def _chat(proxy, sid, key, messages, **kw):
    return post(proxy.openai_base_url(sid) + "/chat/completions", key,
                dict({"model": "policy", "messages": messages, "max_tokens": 4}, **kw))


def _stream_error(r: httpx.Response) -> dict:
    """The error event of an OpenAI-shaped stream (200 already sent when the engine failed)."""
    assert r.status_code == 200, r.text
    errs = [json.loads(d)["error"] for _, d in sse_events(r.text) if d != "[DONE]" and "error" in json.loads(d)]
    assert len(errs) == 1, r.text
    return errs[0]


def test_a_stopped_engine_times_out_every_call_kind_and_each_failure_is_recorded(tok, engine_proc):
    from harnessrl.gym.episode import engine_failures

    proc, url = engine_proc
    # warm the engine up first, so that the calls before the SIGSTOP finish well within the bounds
    httpx.post(url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
               timeout=120).raise_for_status()
    base = ProxyConfig(engine_url=url, keepalive_s=0.5, engine_first_byte_timeout_s=4.0, engine_idle_timeout_s=4.0,
                       engine_total_timeout_s=4.0)
    with ProxyServer(base, tokenizer=tok) as proxy, \
            ProxyServer(base.model_copy(update={"engine_stream": True, "engine_total_timeout_s": 30.0}),
                        tokenizer=tok) as relay:
        sid, key = proxy.open_session({"task_id": "stop"})
        rsid, rkey = relay.open_session({"task_id": "stop-relay"})
        msgs = [{"role": "user", "content": "Count to three."}]
        r = _chat(proxy, sid, key, msgs)
        assert r.status_code == 200, r.text
        first = r.json()["choices"][0]["message"]
        assert _chat(relay, rsid, rkey, msgs).status_code == 200  # the relay has asked its model info
        msgs += [first, {"role": "user", "content": "Go on."}]

        os.kill(proc.pid, signal.SIGSTOP)
        plain = _chat(proxy, sid, key, msgs)
        buffered = _chat(proxy, sid, key, msgs, stream=True)
        relayed = _chat(relay, rsid, rkey, msgs, stream=True)
        os.kill(proc.pid, signal.SIGCONT)
        again = _chat(proxy, sid, key, msgs)  # the engine answers again: the session goes on
        assert again.status_code == 200, again.text

        proc.kill()
        proc.wait(30)
        dead = _chat(proxy, sid, key, msgs + [again.json()["choices"][0]["message"],
                                               {"role": "user", "content": "More."}])
        t = proxy.trajectory(sid)
        rt = relay.trajectory(rsid)

    assert plain.status_code == 504, plain.text
    assert plain.json()["error"]["type"] == "api_error" and "timed out" in plain.json()["error"]["message"]
    assert _stream_error(buffered)["code"] == 504
    relay_err = _stream_error(relayed)
    assert relay_err["code"] == 504 and "first chunk" in relay_err["message"]
    assert dead.status_code == 503, dead.text

    # five calls in the record: ok, timed out (plain), timed out (buffered stream), ok, refused connection
    assert [c.finish_reason for c in t.calls][1:3] == ["engine_error", "engine_error"]
    assert t.calls[4].finish_reason == "engine_error" and len(t.calls) == 5
    for c in (t.calls[1], t.calls[2], t.calls[4]):
        assert c.detached and c.completion_ids == [] and c.flags["detached"] == "engine_error"
        assert c.flags["engine_error"]
    assert t.calls[2].prompt_ids == t.calls[1].prompt_ids  # the prompts rebuilt from their deltas
    assert t.calls[4].prompt_ids[:len(t.segments[0].token_ids)] == t.segments[0].token_ids
    assert [t.calls[i].flags["engine_timeout_phase"] for i in (1, 2)] == ["total", "total"]
    assert [t.calls[i].flags["engine_healthy"] for i in (1, 2)] == [False, False]  # stopped: no /health either
    assert t.calls[4].flags["engine_error_kind"] == "unavailable"
    assert engine_failures(t) == [1, 2, 4] and engine_failures(rt) == [1]
    rc = rt.calls[1]
    assert rc.detached and rc.flags["engine_timeout_phase"] == "first_byte" and rc.finish_reason == "engine_error"

    # the failed calls are in no segment: one segment, sampled tokens = the two delivered replies
    ok = [t.calls[0], t.calls[3]]
    assert len(t.segments) == 1 and all(not c.detached for c in ok)
    seg = t.segments[0]
    assert t.calls[3].prompt_ids == t.calls[1].prompt_ids  # the retry after SIGCONT sent the same prompt
    assert seg.token_ids == t.calls[3].prompt_ids + t.calls[3].completion_ids
    assert [x for x, m in zip(seg.token_ids, seg.loss_mask) if m] == ok[0].completion_ids + ok[1].completion_ids
    t.validate()


def _wait_for_calls(proxy, sid: str, n: int) -> None:
    """Until the proxy has recorded `n` calls of `sid` (it does so after the client left)."""
    deadline = time.monotonic() + 60
    while len(proxy.trajectory(sid).calls) < n:
        assert time.monotonic() < deadline, "the proxy never recorded the call"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_whose_client_gave_up_is_recorded_undelivered_and_never_trained(tok, stream):
    from harnessrl.trainers.samples import SampleConfig, build_samples

    eng, script = standin(tok)
    # keep-alive polls rarely: the plain call generates to its end, then finds its client gone
    cfg = ProxyConfig(engine_url="", keepalive_s=30.0)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({"task_id": "gone"})
        msgs = [{"role": "user", "content": "hello"}]
        script.say("first reply")
        first = _chat(p, sid, key, msgs).json()["choices"][0]["message"]
        msgs += [first, {"role": "user", "content": "and now?"}]

        script.say("never seen by the harness")
        eng.token_delay_s = 0.3  # the reply takes ~2 s; the client gives up at 0.5 s
        url = p.openai_base_url(sid) + "/chat/completions"
        body = {"model": "policy", "messages": msgs, "max_tokens": 16, "stream": stream}
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"},
                              timeout=httpx.Timeout(60, read=0.5)) as r:
                for _ in r.iter_bytes():  # a stream's start event comes, then the wait
                    pass
        _wait_for_calls(p, sid, 2)
        eng.token_delay_s = 0.0
        script.say("the retry")
        retry = _chat(p, sid, key, msgs)  # the harness retries the same request
        assert retry.status_code == 200, retry.text
        p.set_reward(sid, 1.0, "ok")
        t = p.trajectory(sid)
        lost_ids = eng.calls[1]["output_ids"]

    lost = t.calls[1]
    assert lost.detached and lost.flags["undelivered"] == "client_disconnected"
    assert lost.flags["detached"] == "undelivered"
    if not stream:  # generated to the end, recorded, never delivered
        assert lost.completion_ids == lost_ids == tok.encode("never seen by the harness", add_special_tokens=False) + [2]
    assert lost.prompt_ids == t.calls[2].prompt_ids  # the retry extends the same segment, same prompt
    assert len(t.segments) == 1 and t.segments[0].split_reason is None
    seg = t.segments[0]
    assert seg.token_ids == t.calls[2].prompt_ids + t.calls[2].completion_ids
    assert [x for x, m in zip(seg.token_ids, seg.loss_mask) if m] == t.calls[0].completion_ids + t.calls[2].completion_ids
    # the trainer's view: every sample's mask-1 tokens are the delivered completions only
    batch = build_samples([t], SampleConfig(baseline="none"))
    trained = [x for smp in batch.samples for x, m in zip(smp.token_ids, smp.loss_mask) if m]
    assert trained == t.calls[0].completion_ids + t.calls[2].completion_ids


def test_a_plain_call_whose_client_left_early_stops_its_generation(tok):
    """With frequent polls the proxy notices the client is gone mid-generation, stops the
    engine request and records the call undelivered with what it had (nothing)."""
    eng, script = standin(tok)
    cfg = ProxyConfig(engine_url="", keepalive_s=0.1)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({})
        eng.token_delay_s = 1.0  # ~6 s of generation
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(p.openai_base_url(sid) + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "policy", "messages": [{"role": "user", "content": "x"}]},
                       timeout=httpx.Timeout(60, read=0.3))
        _wait_for_calls(p, sid, 1)
        t = p.trajectory(sid)
        stats = p.stats()
    c = t.calls[0]
    assert c.detached and c.flags["undelivered"] == "client_disconnected" and c.completion_ids == []
    assert t.segments == [] and stats["undelivered"] == 1


def test_a_call_past_the_total_bound_on_a_healthy_engine_is_recorded_as_such(tok):
    """The bound fails a call that is merely long, too; the record says the engine answered
    /health right after, so an episode judge can tell a long answer from a dead engine."""
    eng, script = standin(tok)
    cfg = ProxyConfig(engine_url="", engine_total_timeout_s=0.5)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({})
        eng.token_delay_s = 1.0  # ~6 s of generation against a 0.5 s bound
        r = _chat(p, sid, key, [{"role": "user", "content": "x"}], max_tokens=16)
        t = p.trajectory(sid)
    assert r.status_code == 504 and "EngineTimeouts.total_s" in r.json()["error"]["message"]
    c = t.calls[0]
    assert (c.finish_reason, c.flags["engine_timeout_phase"], c.flags["engine_healthy"]) == ("engine_error", "total", True)
