"""Anthropic Messages through the proxy (Claude Code's dialect): system blocks, system
turns inside messages, tool_use / tool_result round trips, streamed and not, exact token
ids, the anthropic SDK, and Claude Code's real request shapes (HEAD /, ?beta=true)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import load_tokenizer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import check_exact, dialect_env, fill_placeholders, fixture_requests, post, sse_events

pytestmark = pytest.mark.timeout(120)

TOOLS = [{"name": "Bash", "description": "Run a command.", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
CALL = 'Checking.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "cat hello.txt"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module", params=[False, True], ids=["buffered-stream", "engine-stream"])
def env(tok, request):
    with dialect_env(tok, engine_stream=request.param) as e:
        yield e


def _session(env):
    sid, key = env.proxy.open_session({"harness": "claude-code"})
    return sid, key, env.proxy.anthropic_base_url(sid) + "/v1/messages?beta=true", len(env.eng.calls)


def _message(r, stream: bool) -> dict:
    """The assistant message of a (streamed) reply, assembled the way clients do."""
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    evs = [(e, json.loads(d)) for e, d in sse_events(r.text)]
    assert evs[0][0] == "message_start" and evs[-1][0] == "message_stop"
    msg = evs[0][1]["message"]
    blocks: dict[int, dict] = {}
    partial: dict[int, str] = {}
    for name, d in evs:
        assert d["type"] == name
        if name == "content_block_start":
            blocks[d["index"]] = dict(d["content_block"])
        elif name == "content_block_delta":
            if d["delta"]["type"] == "text_delta":
                blocks[d["index"]]["text"] += d["delta"]["text"]
            else:
                partial[d["index"]] = partial.get(d["index"], "") + d["delta"]["partial_json"]
        elif name == "message_delta":
            msg["stop_reason"] = d["delta"]["stop_reason"]
            msg["usage"] = d["usage"]
    for i, pj in partial.items():
        blocks[i]["input"] = json.loads(pj)
    msg["content"] = [blocks[i] for i in sorted(blocks)]
    return msg


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip_records_exact_ids(env, stream):
    sid, key, url, n0 = _session(env)
    env.script.say(CALL, "hello.txt says hi.")
    body = {"model": "policy", "max_tokens": 32000, "stream": stream, "tools": TOOLS,
            "system": [{"type": "text", "text": "You are Claude Code."},
                       {"type": "text", "text": " Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What does hello.txt say?"}]},
                         {"role": "system", "content": "Reminder: use tools."}],
            "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"}, "output_config": {"effort": "high"},
            "context_management": {"edits": []}}
    msg = _message(post(url, key, body, headers={"x-api-key": key, "anthropic-version": "2023-06-01"}), stream)
    assert msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    tu = msg["content"][1]
    assert tu["name"] == "Bash" and tu["input"] == {"command": "cat hello.txt"}
    body["messages"] += [{"role": "assistant", "content": msg["content"]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu["id"],
                                                       "content": [{"type": "text", "text": "hi"}],
                                                       "is_error": False}]}]
    msg = _message(post(url, key, body), stream)
    assert msg["content"] == [{"type": "text", "text": "hello.txt says hi."}] and msg["stop_reason"] == "end_turn"
    assert msg["usage"]["output_tokens"] == len(env.eng.calls[-1]["output_ids"])
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1 and traj.calls[1].dialect == "anthropic_messages"
    check_exact(traj, env.eng.calls[n0:])


def test_anthropic_sdk_sync_and_streaming(env):
    import anthropic  # here, not at collection: 2.7 s that every xdist worker would pay

    sid, key, url, n0 = _session(env)
    client = anthropic.Anthropic(base_url=env.proxy.anthropic_base_url(sid), api_key=key, max_retries=0)
    env.script.say(CALL, "All clear.")
    msgs = [{"role": "user", "content": "check hello.txt"}]
    r = client.messages.create(model="policy", max_tokens=512, system="Be brief.", messages=msgs, tools=TOOLS)
    tu = [b for b in r.content if b.type == "tool_use"][0]
    assert r.stop_reason == "tool_use" and tu.input == {"command": "cat hello.txt"}
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "hi"}]}]
    with client.messages.stream(model="policy", max_tokens=512, system="Be brief.", messages=msgs,
                                tools=TOOLS) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "All clear." and final.stop_reason == "end_turn"
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1
    check_exact(traj, env.eng.calls[n0:])


def test_claude_code_request_shapes_get_200(env):
    sid, key, url, n0 = _session(env)
    base = env.proxy.anthropic_base_url(sid)
    for rec in fixture_requests("claude-code.jsonl"):
        if rec["method"] == "HEAD":
            assert httpx.head(base + rec["path"]).status_code == 200
            assert httpx.head(env.proxy.url + "/").status_code == 200
            continue
        body = fill_placeholders(rec["body"], model="probe-model")
        r = post(base + rec["path"], key, body, headers={"x-api-key": key, "authorization": "",
                                                         "anthropic-version": "2023-06-01"})
        _message(r, True)
    traj = env.proxy.trajectory(sid)
    assert len(traj.calls) == 2
    check_exact(traj, env.eng.calls[n0:])


def test_errors_use_anthropic_shape(env):
    sid, key, url, n0 = _session(env)
    r = post(url, "wrong", {"model": "policy", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401 and r.json() == {"type": "error", "error": {
        "type": "authentication_error", "message": "invalid API key for this session"}}
    r = post(url, key, {"model": "policy", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}]})
    assert r.status_code == 400 and "toolu_x" in r.json()["error"]["message"]
    r = post(url, key, {"model": "claude-opus", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    env.script.say("ok")
    assert _message(post(url, key, {"model": "policy", "max_tokens": 5,
                                    "messages": [{"role": "user", "content": "x"}]}), False)["content"][0]["text"] == "ok"


def test_count_tokens_is_the_full_render(env, tok):
    sid, key, url, n0 = _session(env)
    body = {"model": "policy", "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    r = post(env.proxy.anthropic_base_url(sid) + "/v1/messages/count_tokens", key, body)
    from harnessrl.gym.proxy.anthropic_messages import parse

    req = parse(dict(body, max_tokens=1))
    assert r.status_code == 200 and r.json() == {
        "input_tokens": len(env.proxy.core.renderer.full_prompt(req.messages, req.tools))}
    assert r.json()["input_tokens"] > 100  # the tool list is in the prompt
