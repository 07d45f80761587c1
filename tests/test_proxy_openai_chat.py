"""OpenAI Chat Completions through the proxy: multi-turn tool calls (streamed and not),
exact token ids, the openai SDK unchanged, real harness request shapes, tool-call and
stop-string edge cases. Stand-in engine on loopback, real tokenizer."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest

from harnessrl.gym.models import load_tokenizer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import check_exact, dialect_env, fill_placeholders, fixture_requests, post, sse_events

pytestmark = pytest.mark.timeout(120)

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
CALL_LS = 'I will list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
CALL_TWO = ('<tool_call>\n{"name": "bash", "arguments": {"command": "cat a.py"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "bash", "arguments": {"command": "cat b.py"}}\n</tool_call>')


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module", params=[False, True], ids=["buffered-stream", "engine-stream"])
def env(tok, request):
    with dialect_env(tok, engine_stream=request.param) as e:
        yield e


def _session(env):
    sid, key = env.proxy.open_session({"harness": "test"})
    return sid, key, env.proxy.openai_base_url(sid) + "/chat/completions", len(env.eng.calls)


def _collect_stream(text: str) -> dict:
    """Assemble a streamed chat completion the way clients do."""
    content, calls, finish, usage = "", {}, None, None
    events = sse_events(text)
    assert events[-1][1] == "[DONE]"
    for _, data in events[:-1]:
        ch = json.loads(data)
        usage = ch.get("usage") or usage
        for choice in ch["choices"]:
            d = choice["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                calls.setdefault(tc["index"], tc)
            finish = choice["finish_reason"] or finish
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{k: v for k, v in calls[i].items() if k != "index"} for i in sorted(calls)]
    return {"message": msg, "finish_reason": finish, "usage": usage}


def _call(url, key, body):
    r = post(url, key, body)
    assert r.status_code == 200, r.text
    if body.get("stream"):
        return _collect_stream(r.text)
    ch = r.json()["choices"][0]
    return {"message": ch["message"], "finish_reason": ch["finish_reason"], "usage": r.json()["usage"]}


@pytest.mark.parametrize("stream", [False, True])
def test_multi_turn_tool_calls_record_exact_engine_ids(env, tok, stream):
    sid, key, url, n0 = _session(env)
    env.script.say(CALL_LS, CALL_TWO, "Both files are fine.")
    msgs = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "Check the repository."}]
    body = {"model": "policy", "messages": msgs, "tools": TOOLS, "stream": stream,
            "stream_options": {"include_usage": True}}
    out = _call(url, key, body)
    assert out["finish_reason"] == "tool_calls"
    m = out["message"]
    assert m["content"].strip() == "I will list the files."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m["tool_calls"]] == \
        [("bash", {"command": "ls"})]
    msgs += [m, {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "a.py\nb.py"}]
    out = _call(url, key, body)
    m = out["message"]
    assert [json.loads(c["function"]["arguments"])["command"] for c in m["tool_calls"]] == ["cat a.py", "cat b.py"]
    # tool results as a list of text parts, assistant content null
    m = dict(m, content=None)
    msgs += [m] + [{"role": "tool", "tool_call_id": c["id"], "content": [{"type": "text", "text": f"print({i})"}]}
                   for i, c in enumerate(m["tool_calls"])]
    out = _call(url, key, body)
    assert out["message"]["content"] == "Both files are fine." and out["finish_reason"] == "stop"
    if stream:
        assert out["usage"]["completion_tokens"] == len(env.eng.calls[-1]["output_ids"])
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1 and [c.segment for c in traj.calls] == [0, 0, 0]
    check_exact(traj, env.eng.calls[n0:])
    # token-exact growth equals a full render of the final conversation (this template)
    final = msgs + [{"role": "assistant", "content": "Both files are fine."}]
    from harnessrl.gym.proxy.openai_chat import parse

    req = parse({"model": "policy", "messages": final, "tools": TOOLS})
    full = tok.apply_chat_template(env.proxy.core.renderer.tool_format.to_template(req.messages, req.tools),
                                   tokenize=False)
    seg_text = tok.decode(traj.segments[0].token_ids)
    assert seg_text == full.rstrip("\n")  # the last reply ends at its sampled <|im_end|>
    assert traj.chat_template_hash == env.proxy.core.renderer.template_hash


def test_streamed_and_non_streamed_calls_record_the_same_ids(env):
    records = []
    for stream in (False, True):
        sid, key, url, n0 = _session(env)
        env.script.say(CALL_LS, "done")
        msgs = [{"role": "user", "content": "go"}]
        out = _call(url, key, {"model": "policy", "messages": msgs, "tools": TOOLS, "stream": stream})
        msgs += [out["message"], {"role": "tool", "tool_call_id": out["message"]["tool_calls"][0]["id"],
                                  "content": "x"}]
        _call(url, key, {"model": "policy", "messages": msgs, "tools": TOOLS, "stream": stream})
        t = env.proxy.trajectory(sid)
        records.append([(c.prompt_ids, c.completion_ids, c.logprobs) for c in t.calls])
    assert records[0] == records[1]


def test_openai_sdk_sync_and_streaming(env):
    sid, key, url, n0 = _session(env)
    client = openai.OpenAI(base_url=env.proxy.openai_base_url(sid), api_key=key, max_retries=0)
    env.script.say(CALL_LS, "All good.", "Bye")
    msgs = [{"role": "user", "content": "look around"}]
    r = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
    tc = r.choices[0].message.tool_calls[0]
    assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": "ls"}
    assert r.usage.completion_tokens == len(env.eng.calls[-1]["output_ids"])
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": tc.id, "content": "README"}]
    text = ""
    with client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, stream=True,
                                        stream_options={"include_usage": True}) as s:
        for chunk in s:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    assert text == "All good."
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
    assert client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS).choices[0].message.content == "Bye"
    assert [m.id for m in client.models.list().data] == ["policy", "probe-model"]
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1
    check_exact(traj, env.eng.calls[n0:])


@pytest.mark.parametrize("name", ["mini-swe-agent.jsonl", "aider.jsonl", "opencode.jsonl"])
def test_real_harness_request_shapes_get_200(env, name):
    sid, key, url, n0 = _session(env)
    for rec in fixture_requests(name):
        body = fill_placeholders(rec["body"], model="probe-model")
        r = post(env.proxy.url + f"/s/{sid}" + rec["path"], key, body)
        assert r.status_code == 200, r.text
        if body.get("stream"):
            events = sse_events(r.text)
            assert events[-1][1] == "[DONE]"
            if body.get("stream_options", {}).get("include_usage"):
                assert json.loads(events[-2][1])["usage"]["prompt_tokens"] > 0
        else:
            assert r.json()["choices"][0]["message"]["role"] == "assistant"
    traj = env.proxy.trajectory(sid)
    assert len(traj.calls) == len(fixture_requests(name))
    check_exact(traj, env.eng.calls[n0:])


def test_truncated_tool_call_is_text_with_a_flag_and_tokens_untouched(env, tok):
    sid, key, url, n0 = _session(env)
    cut = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la'
    env.script.say(cut, eos=False)
    n = len(tok.encode(cut, add_special_tokens=False))
    msgs = [{"role": "user", "content": "go"}]
    out = _call(url, key, {"model": "policy", "messages": msgs, "tools": TOOLS, "max_tokens": n})
    assert out["finish_reason"] == "length"
    assert out["message"]["content"] == cut and "tool_calls" not in out["message"]
    # the harness carries on: the template's end-of-turn tokens are appended, not sampled
    env.script.say("ok")
    msgs += [out["message"], {"role": "user", "content": "try again"}]
    _call(url, key, {"model": "policy", "messages": msgs, "tools": TOOLS})
    traj = env.proxy.trajectory(sid)
    assert traj.calls[0].flags["tool_call"] == "tool_call_truncated"
    check_exact(traj, env.eng.calls[n0:])
    seg = traj.segments[0]
    end = len(traj.calls[0].prompt_ids) + n
    assert seg.token_ids[end:end + 2] == [2, 198] and seg.loss_mask[end:end + 2] == [0, 0]


def test_bad_json_tool_call_is_text_with_a_flag(env):
    sid, key, url, n0 = _session(env)
    bad = '<tool_call>\n{"name": "bash", "arguments": {command: ls}}\n</tool_call>'
    env.script.say(bad)
    out = _call(url, key, {"model": "policy", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS})
    assert out["message"]["content"] == bad and out["finish_reason"] == "stop"
    t = env.proxy.trajectory(sid)
    assert t.calls[0].flags["tool_call"] == "tool_call_bad_json"
    check_exact(t, env.eng.calls[n0:])


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text_and_ids_and_next_turn_extends(env, tok, stream):
    sid, key, url, n0 = _session(env)
    env.script.say("Answer: 42\nEND and more words after the stop", "fine")
    msgs = [{"role": "user", "content": "question"}]
    out = _call(url, key, {"model": "policy", "messages": msgs, "stop": ["END"], "stream": stream})
    assert out["message"]["content"] == "Answer: 42\n" and out["finish_reason"] == "stop"
    msgs += [out["message"], {"role": "user", "content": "and?"}]
    _call(url, key, {"model": "policy", "messages": msgs, "stream": stream})
    t = env.proxy.trajectory(sid)
    first = t.calls[0]
    assert first.flags["stop_cut"] > 0
    assert tok.decode(first.completion_ids).endswith("END")
    assert first.completion_ids == env.eng.calls[n0]["output_ids"][:len(first.completion_ids)]
    assert len(t.segments) == 1
    # the second prompt continues from the (cut) sampled ids, then <|im_end|>\n non-sampled
    p2 = t.calls[1].prompt_ids
    k = len(first.prompt_ids) + len(first.completion_ids)
    assert p2[:k] == first.prompt_ids + first.completion_ids and p2[k:k + 2] == [2, 198]
