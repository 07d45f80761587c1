"""OpenAI Responses through the proxy (Codex CLI's only dialect): developer items,
function_call / function_call_output round trips, the streamed event sequence, exact
token ids, the openai SDK, and Codex's real request shapes."""
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

TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
         {"type": "web_search"}]
CALL = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "cat hello.txt"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module", params=[False, True], ids=["buffered-stream", "engine-stream"])
def env(tok, request):
    with dialect_env(tok, engine_stream=request.param) as e:
        yield e


def _session(env):
    sid, key = env.proxy.open_session({"harness": "codex"})
    return sid, key, env.proxy.openai_base_url(sid) + "/responses", len(env.eng.calls)


def _output(r, stream: bool) -> list[dict]:
    """The output items of a (streamed) response, checking the event sequence Codex needs."""
    assert r.status_code == 200, r.text
    if not stream:
        assert r.json()["status"] == "completed"
        return r.json()["output"]
    events = sse_events(r.text)
    kinds = [e for e, _ in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    datas = [json.loads(d) for _, d in events]
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    added = [d["item"]["type"] for d in datas if d["type"] == "response.output_item.added"]
    done = [d["item"] for d in datas if d["type"] == "response.output_item.done"]
    assert added == [i["type"] for i in done]
    final = datas[-1]["response"]["output"]
    assert final == done
    deltas = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
    texts = [c["text"] for i in done if i["type"] == "message" for c in i["content"]]
    assert deltas == "".join(texts)
    return final


@pytest.mark.parametrize("stream", [False, True])
def test_codex_like_turns_record_exact_ids(env, stream):
    sid, key, url, n0 = _session(env)
    env.script.say("Reading it.\n" + CALL, "It says hello.")
    inp = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be terse."}]},
           {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."},
                                                                {"type": "input_text", "text": " Approvals: never."}]},
           {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is in hello.txt?"}]}]
    body = {"model": "policy", "stream": stream, "input": inp, "tools": TOOLS, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc", "client_metadata": {"x": "y"}}
    out = _output(post(url, key, body), stream)
    assert [i["type"] for i in out] == ["message", "function_call"]
    fc = out[1]
    assert fc["name"] == "exec_command" and json.loads(fc["arguments"]) == {"cmd": "cat hello.txt"}
    # Codex echoes the items back (with a reasoning item it may add) and appends the output
    inp += [{"type": "reasoning", "summary": []}, out[0],
            {"type": "function_call", "id": fc["id"], "call_id": fc["call_id"], "name": fc["name"],
             "arguments": fc["arguments"], "status": "completed"},
            {"type": "function_call_output", "call_id": fc["call_id"], "output": "hello world\n"}]
    out = _output(post(url, key, dict(body, input=inp)), stream)
    assert out[0]["content"][0]["text"] == "It says hello."
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1 and traj.calls[0].dialect == "openai_responses"
    check_exact(traj, env.eng.calls[n0:])


def test_openai_sdk_responses_sync_and_streaming(env):
    sid, key, url, n0 = _session(env)
    client = openai.OpenAI(base_url=env.proxy.openai_base_url(sid), api_key=key, max_retries=0)
    env.script.say(CALL, "Done reading.")
    inp = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "read hello.txt"}]
    r = client.responses.create(model="policy", input=inp, tools=TOOLS[:1])
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and json.loads(calls[0].arguments) == {"cmd": "cat hello.txt"}
    assert r.usage.output_tokens == len(env.eng.calls[-1]["output_ids"])
    inp += [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "hello"}]
    kinds, text = [], ""
    for ev in client.responses.create(model="policy", input=inp, tools=TOOLS[:1], stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            assert ev.response.output_text == "Done reading."
    assert text == "Done reading." and kinds[-1] == "response.completed"
    traj = env.proxy.trajectory(sid)
    assert len(traj.segments) == 1
    check_exact(traj, env.eng.calls[n0:])


def test_codex_request_shapes_get_200(env):
    sid, key, url, n0 = _session(env)
    for rec in fixture_requests("codex-cli.jsonl"):
        body = fill_placeholders(rec["body"], model="probe-model")
        r = post(env.proxy.url + f"/s/{sid}" + rec["path"], key, body, headers={"accept": "text/event-stream"})
        _output(r, True)
    assert len(env.proxy.trajectory(sid).calls) == 2


def test_previous_response_id_and_bad_items_get_clear_400s(env):
    sid, key, url, n0 = _session(env)
    r = post(url, key, {"model": "policy", "input": "hi", "previous_response_id": "resp_1"})
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    r = post(url, key, {"model": "policy", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})
    assert r.status_code == 400 and "matches no earlier tool call" in r.json()["error"]["message"]
    r = post(url, key, {"model": "policy", "input": [{"type": "message", "role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and "wizard" in r.json()["error"]["message"]
    env.script.say("fine")
    r = post(url, key, {"model": "policy", "input": "hi"})
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "fine"
    assert len(env.proxy.trajectory(sid).calls) == 1
