"""Sessions, admin API, bad input, history rewrites, pause / interrupted generation,
concurrency, durability and export. Stand-in engine on loopback, real tokenizer, real HTTP."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pyarrow.parquet as pq
import pytest

from harnessrl.gym.doubles.standin import StandinEngine, default_responder
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer, Store

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, check_exact, post, standin

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def env(tok, tmp_path_factory):
    eng, script = standin(tok)
    db = tmp_path_factory.mktemp("proxy") / "calls.db"
    cfg = ProxyConfig(engine_url="", db_path=str(db), max_body_bytes=64 * 1024, pause_wait_s=0.3, retry_after_s=7)
    with ServedApp(eng.app()) as e:
        with ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
            yield SimpleNamespace(eng=eng, script=script, proxy=p, engine_url=e.url, db=db)


def _chat(env, sid, key, messages, **kw):
    return post(env.proxy.openai_base_url(sid) + "/chat/completions", key,
                dict({"model": "policy", "messages": messages}, **kw))


def _reply(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def test_keys_sessions_and_isolation(env):
    a, ka = env.proxy.open_session({})
    b, kb = env.proxy.open_session({})
    msgs = [{"role": "user", "content": "hi"}]
    assert _chat(env, a, "sk-wrong", msgs).status_code == 401
    r = _chat(env, a, kb, msgs)  # b's key does not open a
    assert r.status_code == 401 and "invalid API key" in r.json()["error"]["message"]
    r = _chat(env, "nosuchsession", ka, msgs)
    assert r.status_code == 404 and "nosuchsession" in r.json()["error"]["message"]
    r = HTTP.post(env.proxy.openai_base_url(a) + "/chat/completions", json={"model": "policy", "messages": msgs},
                   headers={"x-api-key": ka})
    assert r.status_code == 200
    env.proxy.close_session(b)
    assert _chat(env, b, kb, msgs).status_code == 404
    assert len(env.proxy.trajectory(a).calls) == 1 and env.proxy.trajectory(b).calls == []


@pytest.mark.parametrize("raw, status, needle", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "policy", "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "wizard"),
    (json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x"},
                                                 {"role": "tool", "tool_call_id": "call_9", "content": "y"}]}).encode(),
     400, "call_9"),
    (json.dumps({"model": "policy", "messages": []}).encode(), 400, "messages"),
    (json.dumps({"model": "policy", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
     400, "image_url"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "gpt-9"),
    (json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x" * 70000}]}).encode(), 413, "limit"),
])
def test_bad_input_gets_a_clear_4xx_and_the_session_stays_usable(env, raw, status, needle):
    sid, key = env.proxy.open_session({})
    env.script.say("first")
    msgs = [{"role": "user", "content": "start"}]
    first = _reply(_chat(env, sid, key, msgs))
    r = post(env.proxy.openai_base_url(sid) + "/chat/completions", key, None, raw=raw)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    env.script.say("second")
    msgs += [first, {"role": "user", "content": "more"}]
    assert _reply(_chat(env, sid, key, msgs))["content"] == "second"
    t = env.proxy.trajectory(sid)
    assert len(t.calls) == 2 and len(t.segments) == 1  # the bad call left no trace and broke nothing


def test_unknown_fields_are_tolerated(env):
    sid, key = env.proxy.open_session({})
    env.script.say("ok")
    r = _chat(env, sid, key, [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}],
              frobnicate=True, logit_bias={}, user="u", parallel_tool_calls=False, reasoning_effort="low")
    assert _reply(r)["content"] == "ok"


def test_history_rewrite_starts_a_new_segment_and_loses_no_token(env):
    sid, key = env.proxy.open_session({})
    n0 = len(env.eng.calls)
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    for i in range(3):
        env.script.say(f"step {i}")
        msgs += [_reply(_chat(env, sid, key, msgs)), {"role": "user", "content": f"observation {i}"}]
    # the harness compacts: system + a summary replace the history
    env.script.say("after summary")
    msgs = [msgs[0], {"role": "user", "content": "Summary: three steps done."}]
    msgs += [_reply(_chat(env, sid, key, msgs)), {"role": "user", "content": "go on"}]
    env.script.say("continuing")
    _reply(_chat(env, sid, key, msgs))
    t = env.proxy.trajectory(sid)
    assert len(t.segments) == 2 and t.segments[1].split_reason == "summarization"
    assert [c.segment for c in t.calls] == [0, 0, 0, 1, 1]
    check_exact(t, env.eng.calls[n0:])
    sampled = sum(sum(s.loss_mask) for s in t.segments)
    assert sampled == sum(len(ec["output_ids"]) for ec in env.eng.calls[n0:])


@pytest.mark.parametrize("edit, reason", [
    (lambda m: m[:2] + m[4:], "truncation"),
    (lambda m: m[:1] + [{"role": "user", "content": "a different task"}] + m[2:], "edited"),
    (lambda m: m[:-2] + [dict(m[-2], content="I edited my reply"), m[-1]], "assistant_edited"),
    (lambda m: [{"role": "system", "content": "title generator"}] + m[1:2], "new_conversation"),
])
def test_rewrite_reason_classes(env, edit, reason):
    sid, key = env.proxy.open_session({})
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    for i in range(2):
        env.script.say(f"step {i}")
        msgs += [_reply(_chat(env, sid, key, msgs)), {"role": "user", "content": f"obs {i}"}]
    env.script.say("x")
    _reply(_chat(env, sid, key, edit(msgs)))
    t = env.proxy.trajectory(sid)
    assert [s.split_reason for s in t.segments] == [None, reason]


def test_side_call_does_not_break_the_main_segment(env):
    """OpenCode/aider interleave title or commit-message calls: the main conversation keeps growing."""
    sid, key = env.proxy.open_session({})
    main = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    env.script.say("step 0", "A title", "step 1")
    main += [_reply(_chat(env, sid, key, main)), {"role": "user", "content": "obs"}]
    _reply(_chat(env, sid, key, [{"role": "system", "content": "Write a title"}, {"role": "user", "content": "task"}]))
    _reply(_chat(env, sid, key, main))
    t = env.proxy.trajectory(sid)
    assert [c.segment for c in t.calls] == [0, 1, 0] and t.segments[1].split_reason == "new_conversation"
    assert t.segments[0].token_ids == t.calls[2].prompt_ids + t.calls[2].completion_ids


def test_timings_and_env_time(env):
    sid, key = env.proxy.open_session({})
    env.script.say("a", "b")
    msgs = [{"role": "user", "content": "x"}]
    msgs += [_reply(_chat(env, sid, key, msgs)), {"role": "user", "content": "y"}]
    time.sleep(0.2)  # the "environment" works between calls
    _reply(_chat(env, sid, key, msgs))
    c0, c1 = env.proxy.trajectory(sid).calls
    assert c0.env_s is None and c1.env_s >= 0.2 and c1.gen_s > 0 and c1.queue_s >= 0


def test_admin_api_over_http(env):
    url, tok = env.proxy.url, env.proxy.admin_token
    h = {"Authorization": f"Bearer {tok}"}
    assert HTTP.post(url + "/admin/sessions", json={}, headers={"Authorization": "Bearer nope"}).status_code == 401
    r = HTTP.post(url + "/admin/sessions", json={"meta": {"task_id": "t1", "harness": "aider"}}, headers=h)
    sid, key = r.json()["session_id"], r.json()["key"]
    assert r.json()["openai_base_url"] == f"/s/{sid}/v1"
    env.script.say("hello")
    assert _reply(_chat(env, sid, key, [{"role": "user", "content": "x"}]))["content"] == "hello"
    r = HTTP.post(url + f"/admin/sessions/{sid}/reward", json={"reward": 1.0, "status": "ok",
                                                               "termination": "submitted"}, headers=h)
    assert r.status_code == 200
    assert HTTP.post(url + f"/admin/sessions/{sid}/reward", json={"reward": 1, "status": "bogus"},
                      headers=h).status_code == 400
    t = HTTP.get(url + f"/admin/sessions/{sid}/trajectory", headers=h).json()
    assert (t["reward"], t["status"], t["termination"], t["task_id"], t["harness"]) == \
        (1.0, "ok", "submitted", "t1", "aider")
    assert t["segments"][0]["loss_mask"].count(1) == len(t["calls"][0]["completion_ids"])
    assert HTTP.get(url + "/admin/sessions/nope/trajectory", headers=h).status_code == 404
    stats = HTTP.get(url + "/admin/stats", headers=h).json()
    assert stats["calls"] >= 1 and stats["incremental_exact"] is True
    assert HTTP.post(url + f"/admin/sessions/{sid}/close", headers=h).json() == {"closed": True}
    assert _chat(env, sid, key, [{"role": "user", "content": "x"}]).status_code == 404


def test_pause_makes_new_calls_wait_then_429_with_retry_after(env):
    sid, key = env.proxy.open_session({})
    h = {"Authorization": f"Bearer {env.proxy.admin_token}"}
    HTTP.post(env.proxy.url + "/admin/pause", headers=h)
    try:
        r = _chat(env, sid, key, [{"role": "user", "content": "x"}])
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        assert env.proxy.stats()["paused"] is True
        # a call that arrives during the pause waits and completes once resumed
        env.script.say("waited")
        out = {}
        th = threading.Thread(target=lambda: out.update(r=_chat(env, sid, key, [{"role": "user", "content": "y"}])))
        th.start()
        time.sleep(0.1)
        env.proxy.resume()
        th.join(30)
        assert _reply(out["r"])["content"] == "waited"
    finally:
        env.proxy.resume()


def _continuing(target: list[int]):
    """Responder that continues `target` from wherever the input already holds a prefix of it."""
    def respond(ids: list[int]) -> list[int]:
        for k in range(len(target), 0, -1):
            if ids[-k:] == target[:k]:
                return target[k:]
        return list(target)
    return respond


@pytest.mark.parametrize("stream, engine_stream", [(False, False), (True, False), (True, True)])
def test_interrupted_generation_resumes_and_tokens_keep_their_version(tok, stream, engine_stream):
    target = tok.encode("one two three four five six seven eight nine ten", add_special_tokens=False) + [2]
    started = threading.Event()
    respond = _continuing(target)

    def responder(ids):  # tells the test when the engine began generating (no sleep-based guess)
        started.set()
        return respond(ids)

    eng = StandinEngine(responder=responder, weight_version="3", token_delay_s=0.05)
    cfg = ProxyConfig(engine_url="", engine_stream=engine_stream)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({})
        out = {}
        body = {"model": "policy", "messages": [{"role": "user", "content": "count"}], "stream": stream}
        th = threading.Thread(target=lambda: out.update(r=post(p.openai_base_url(sid) + "/chat/completions", key,
                                                               body)))
        th.start()
        assert started.wait(30)
        time.sleep(0.12)  # a few tokens in (10 tokens take 0.5 s)
        p.pause()  # the trainer: pause admission, abort the engine, update weights, resume
        HTTP.post(e.url + "/pause_generation", json={"mode": "abort"})
        eng.weight_version = "4"
        time.sleep(0.2)
        HTTP.post(e.url + "/continue_generation", json={})
        p.resume()
        th.join(60)
        assert out["r"].status_code == 200
        t = p.trajectory(sid)
        c = t.calls[0]
        assert c.completion_ids == target and c.flags["interruptions"] == 1
        n3 = c.versions.count(3)
        assert 0 < n3 < len(target) and c.versions == [3] * n3 + [4] * (len(target) - n3)
        assert t.segments[0].versions[-len(target):] == c.versions
        # the resumed request was the original prompt + the partial output
        assert eng.calls[-1]["input_ids"] == c.prompt_ids + target[:n3]
        if stream:
            text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                           for line in out["r"].text.splitlines() if line.startswith("data: {"))
        else:
            text = out["r"].json()["choices"][0]["message"]["content"]
        assert text == "one two three four five six seven eight nine ten"  # the harness saw no seam


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_200_concurrent_sessions_5_turns_no_lost_or_crossed_records(tok, tmp_path):
    eng = StandinEngine(responder=default_responder)
    with ServedApp(eng.app()) as e, \
            ProxyServer(ProxyConfig(engine_url=e.url, db_path=str(tmp_path / "c.db")), tokenizer=tok) as p:
        sessions = [p.open_session({"task_id": f"t{i}"}) for i in range(200)]

        async def episode(client, i, sid, key):
            msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": f"task number {i}"}]
            replies = []
            for turn in range(5):
                r = await client.post(f"/s/{sid}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                      json={"model": "policy", "messages": msgs, "stream": turn % 2 == 1})
                assert r.status_code == 200, r.text
                if turn % 2 == 1:
                    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                                   for line in r.text.splitlines()
                                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
                else:
                    text = r.json()["choices"][0]["message"]["content"]
                replies.append(text)
                msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"obs {i}.{turn}"}]
            return replies

        async def main():
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=p.url, limits=limits, timeout=120) as client:
                return await asyncio.gather(*(episode(client, i, s, k) for i, (s, k) in enumerate(sessions)))

        all_replies = asyncio.run(main())
        assert p.core.store.call_count() == 1000
        for i, ((sid, _), replies) in enumerate(zip(sessions, all_replies)):
            t = p.trajectory(sid)
            assert len(t.calls) == 5 and len(t.segments) == 1 and t.task_id == f"t{i}"
            for turn, c in enumerate(t.calls):
                # the reply is a function of this session's own prompt: a crossed record cannot match
                assert c.completion_ids == default_responder(c.prompt_ids)
                assert tok.decode(c.completion_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == replies[turn]
                assert f"task number {i}<" in tok.decode(c.prompt_ids)
            t.validate()


def test_killed_proxy_loses_no_finished_call(tok, tmp_path):
    eng, script = standin(tok)
    db = tmp_path / "calls.db"
    with ServedApp(eng.app()) as e:
        proc = subprocess.Popen([sys.executable, "-m", "harnessrl.gym.proxy", "--engine-url", e.url, "--db", str(db),
                                 "--admin-token", "adm"], stdout=subprocess.PIPE, cwd=ROOT)
        try:
            info = json.loads(proc.stdout.readline())
            h = {"Authorization": "Bearer adm"}
            s = HTTP.post(info["url"] + "/admin/sessions", json={"meta": {"task_id": "k"}}, headers=h).json()
            msgs = [{"role": "user", "content": "x"}]
            replies = []
            for i in range(3):
                r = HTTP.post(info["url"] + f"/s/{s['session_id']}/v1/chat/completions",
                               headers={"Authorization": f"Bearer {s['key']}"},
                               json={"model": "policy", "messages": msgs}, timeout=60)
                replies.append(r.json()["choices"][0]["message"])
                msgs += [replies[-1], {"role": "user", "content": f"y{i}"}]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    store = Store(db)
    t = store.trajectory(s["session_id"])
    assert len(t.calls) == 3 and len(t.segments) == 1 and t.task_id == "k"
    check_exact(t, eng.calls[-3:])
    assert [tok.decode(c.completion_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) for c in t.calls] == [m["content"] for m in replies]


def test_export_jsonl_and_parquet_with_per_token_fields(env, tmp_path):
    sid, key = env.proxy.open_session({"task_id": "exp"})
    env.script.say("a", "b")
    msgs = [{"role": "user", "content": "x"}]
    msgs += [_reply(_chat(env, sid, key, msgs)), {"role": "user", "content": "y"}]
    _reply(_chat(env, sid, key, msgs))
    env.proxy.set_reward(sid, 0.5, "truncated", "call_limit")
    store = env.proxy.core.store
    assert store.export_jsonl(tmp_path / "t.jsonl", [sid]) == 1
    from harnessrl.gym.trajectory import Trajectory

    t = Trajectory.from_dict(json.loads((tmp_path / "t.jsonl").read_text()))
    assert t == env.proxy.trajectory(sid) and t.reward == 0.5 and t.trainable
    assert store.export_parquet(tmp_path / "t.parquet", [sid]) == 1
    row = pq.read_table(tmp_path / "t.parquet").to_pylist()[0]
    seg = t.segments[0]
    assert (row["token_ids"], row["loss_mask"], row["logprobs"], row["versions"]) == \
        (seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions)
    assert (row["reward"], row["status"], row["termination"], row["n_calls"]) == (0.5, "truncated", "call_limit", 2)


def test_unix_socket_serves_harnesses_but_not_admin(tok, tmp_path):
    eng, script = standin(tok)
    uds = str(tmp_path / "proxy.sock")
    with ServedApp(eng.app()) as e, ProxyServer(ProxyConfig(engine_url=e.url, uds_path=uds), tokenizer=tok) as p:
        sid, key = p.open_session({})
        script.say("via socket")
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://proxy") as c:
            r = c.post(f"/s/{sid}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "policy", "messages": [{"role": "user", "content": "x"}]})
            assert r.json()["choices"][0]["message"]["content"] == "via socket"
            r = c.get("/admin/stats", headers={"Authorization": f"Bearer {p.admin_token}"})
            assert r.status_code == 403 and "admin_clients" in r.json()["error"]["message"]
    assert not os.path.exists(uds)


def test_admin_clients_any_opens_the_admin_api_to_non_loopback_clients_with_the_token(tok, tmp_path):
    """For env workers on other nodes. Tested through the unix socket, a client that is not
    loopback TCP (this machine sends no traffic to its other addresses); the token still rules."""
    eng, _ = standin(tok)
    uds = str(tmp_path / "proxy.sock")
    cfg = ProxyConfig(engine_url="", uds_path=uds, admin_clients="any")
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://proxy") as c:
            assert c.get("/admin/stats").status_code == 401
            assert c.get("/admin/stats", headers={"Authorization": "Bearer wrong"}).status_code == 401
            r = c.post("/admin/sessions", headers={"Authorization": f"Bearer {p.admin_token}"},
                       json={"meta": {"task_id": "t"}})
            assert r.status_code == 200
            sid = r.json()["session_id"]
            assert p.trajectory(sid).task_id == "t"
    with pytest.raises(ValueError, match="admin_clients"):
        ProxyConfig(engine_url="x", admin_clients="lan")


def test_buffered_streams_send_keepalives_that_sdks_skip(tok):
    import anthropic
    import openai

    target = tok.encode("slow but steady", add_special_tokens=False) + [2]
    eng = StandinEngine(responder=lambda ids: list(target), token_delay_s=0.05)
    with ServedApp(eng.app()) as e, ProxyServer(ProxyConfig(engine_url=e.url, keepalive_s=0.05), tokenizer=tok) as p:
        sid, key = p.open_session({})
        r = post(p.openai_base_url(sid) + "/chat/completions", key,
                 {"model": "policy", "messages": [{"role": "user", "content": "x"}], "stream": True})
        assert r.text.count(": keep-alive\n\n") >= 2
        oa = openai.OpenAI(base_url=p.openai_base_url(sid), api_key=key, max_retries=0)
        chunks = oa.chat.completions.create(model="policy", messages=[{"role": "user", "content": "y"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "slow but steady"
        events = list(oa.responses.create(model="policy", input="z", stream=True))
        assert events[-1].type == "response.completed" and events[-1].response.output_text == "slow but steady"
        an = anthropic.Anthropic(base_url=p.anthropic_base_url(sid), api_key=key, max_retries=0)
        with an.messages.stream(model="policy", max_tokens=50, messages=[{"role": "user", "content": "w"}]) as s:
            assert "".join(s.text_stream) == "slow but steady"


def test_episode_call_and_token_budgets_are_enforced(env):
    msgs = [{"role": "user", "content": "hi"}]
    sid, key = env.proxy.open_session({"max_calls": 2})
    assert _chat(env, sid, key, msgs).status_code == 200
    assert _chat(env, sid, key, msgs).status_code == 200
    r = _chat(env, sid, key, msgs)
    assert r.status_code == 400 and "max_calls=2" in r.json()["error"]["message"]
    assert len(env.proxy.trajectory(sid).calls) == 2  # the refused call generated nothing

    sid, key = env.proxy.open_session({"max_tokens": 3})
    assert _chat(env, sid, key, msgs, max_tokens=50).status_code == 200
    calls = env.proxy.trajectory(sid).calls
    assert len(calls) == 1 and len(calls[0].completion_ids) == 3  # capped at the episode's budget
    r = _chat(env, sid, key, msgs)
    assert r.status_code == 400 and "max_tokens=3" in r.json()["error"]["message"]


def test_per_turn_staleness_check_aborts_a_too_stale_session(env):
    """The scheduler's per-turn η check for harness episodes: a session opened with
    `staleness_limit` is refused (403, not retried by SDKs) once the trainer's version is more
    than η ahead of its oldest sampled token; the session is recorded stale and stays refused."""
    msgs = [{"role": "user", "content": "hi"}]
    admin = httpx.Client(base_url=env.proxy.url, headers={"Authorization": f"Bearer {env.proxy.admin_token}"})
    assert admin.post("/admin/policy_version", json={"version": "x"}).status_code == 400
    assert admin.post("/admin/policy_version", json={"version": 3}).json() == {"policy_version": 3}
    env.eng.weight_version = "3"
    try:
        sid, key = env.proxy.open_session({"staleness_limit": 1})
        plain, pkey = env.proxy.open_session({})  # no limit: never refused
        assert _chat(env, sid, key, msgs).status_code == 200  # tokens at v3
        assert _chat(env, plain, pkey, msgs).status_code == 200
        env.eng.weight_version = "4"
        assert admin.post("/admin/policy_version", json={"version": 4}).status_code == 200
        assert _chat(env, sid, key, msgs).status_code == 200  # 4 - 3 <= 1: still trainable
        assert admin.post("/admin/policy_version", json={"version": 5}).status_code == 200
        before = env.proxy.core.counters["aborted_stale"]
        r = _chat(env, sid, key, msgs)  # 5 - 3 > 1: this turn's data could not be trained on
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["param"] == "staleness_limit" and "policy version 3" in err["message"] and "now at 5" in err["message"]
        assert _chat(env, sid, key, msgs).status_code == 403  # stays refused
        assert env.proxy.core.counters["aborted_stale"] == before + 1
        t = env.proxy.trajectory(sid)
        assert (t.status, t.termination, t.reward, len(t.calls)) == ("infra_error", "stale", None, 2)
        assert [c.versions for c in t.calls] == [[3] * len(t.calls[0].versions), [4] * len(t.calls[1].versions)]
        assert _chat(env, plain, pkey, msgs).status_code == 200
    finally:
        env.eng.weight_version = "0"
        env.proxy.core.policy_version = None
        admin.close()


def test_generations_carry_an_earliest_deadline_priority(env):
    """The engine `priority` ranks by the episode's oldest policy version (its start version
    until it has sampled, then its oldest sampled token's), then by its group, oldest first:
    -(version * GROUP_SPAN + group id); a session without a version sends none."""
    from harnessrl.gym.proxy.sampling import GROUP_SPAN

    msgs = [{"role": "user", "content": "hi"}]
    env.eng.weight_version = "4"
    try:
        sid, key = env.proxy.open_session({"start_version": 2})
        plain, pkey = env.proxy.open_session({})
        late, lkey = env.proxy.open_session({"start_version": 1, "group_id": 9})
        early, ekey = env.proxy.open_session({"start_version": 1, "group_id": 3})
        huge, hkey = env.proxy.open_session({"start_version": 1, "group_id": GROUP_SPAN + 5})
        n0 = len(env.eng.calls)
        assert _chat(env, sid, key, msgs).status_code == 200
        assert _chat(env, sid, key, msgs).status_code == 200
        assert _chat(env, plain, pkey, msgs).status_code == 200
        for s, k in ((late, lkey), (early, ekey), (huge, hkey)):
            assert _chat(env, s, k, msgs).status_code == 200
        sent = [c.get("priority", "absent") for c in env.eng.calls[n0:]]
        assert sent == [-2 * GROUP_SPAN, -4 * GROUP_SPAN, "absent", -(GROUP_SPAN + 9), -(GROUP_SPAN + 3),
                        -(2 * GROUP_SPAN - 1)]
        # version first, then the older group; a group id past the band stays inside it
        assert sent[4] > sent[3] > sent[5] > sent[0] > sent[1]
    finally:
        env.eng.weight_version = "0"
