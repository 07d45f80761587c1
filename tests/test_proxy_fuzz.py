"""Bad input never breaks the proxy: hypothesis-driven malformed requests to all four
dialects (streamed and not) and to the admin API, over real HTTP on loopback against a
real proxy (stand-in engine, real tokenizer). Each answer is a 4xx in the dialect's shape
naming the field (or a genuine 200), never a 5xx or an error event inside a 200, and a good
request on the same keep-alive connection right after it succeeds. Exact refusals of the
cases the issue reproduced are asserted one by one below."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harnessrl.gym.models import load_tokenizer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_fuzz_cases import (DIALECT_PATHS, GOOD, Case, admin_case, admin_problems, base_bodies, mutate, path_of,
                              problems)
from proxy_helpers import dialect_env

pytestmark = pytest.mark.timeout(600)

EXAMPLES = int(__import__("os").environ.get("FUZZ_EXAMPLES", 300))
"""Hypothesis examples per dialect (each is a bad request plus a good one on its connection)."""

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 65, max_value=2 ** 65)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=6)
"""Replacement values hypothesis draws itself (the mutator's own edge list covers the rest)."""


@pytest.fixture(scope="module")
def env():
    with dialect_env(load_tokenizer("tiny-llama"), engine_stream=False) as e:
        yield e


@pytest.fixture(scope="module")
def bases():
    return {d: base_bodies(d) for d in DIALECT_PATHS}


class Conn:
    """One keep-alive HTTP connection to the proxy (a single pooled connection)."""

    def __init__(self, base: str, key: str):
        self.c = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {key}",
                                                                  "content-type": "application/json"},
                              limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    def send(self, method: str, path: str, content: bytes) -> tuple[httpx.Response, object]:
        r = self.c.request(method, path, content=content)
        return r, r.extensions["network_stream"].get_extra_info("client_addr")


def _session(env) -> Conn:
    sid, key = env.proxy.open_session({"harness": "fuzz"})
    return Conn(f"{env.proxy.url}/s/{sid}", key)


def _check(conn: Conn, dialect: str, case: Case) -> None:
    r, addr = conn.send("POST", case.path, case.content())
    bad = problems(dialect, case, r.status_code, dict(r.headers), r.text)
    assert not bad, f"{case.note}: {bad} -> {r.status_code} {r.text[:300]}"
    g, addr2 = conn.send("POST", DIALECT_PATHS[dialect], json.dumps(GOOD[dialect]).encode())
    assert g.status_code == 200, f"after {case.note}: good request got {g.status_code} {g.text[:200]}"
    assert addr2 == addr, f"after {case.note}: the connection was not kept ({addr} -> {addr2})"


@pytest.mark.parametrize("dialect", list(DIALECT_PATHS))
def test_malformed_requests_get_4xx_and_keep_the_connection(env, bases, dialect):
    conn = _session(env)
    errors_5xx = env.proxy.stats()["errors_5xx"]
    sent = []

    @FUZZ
    @given(rng=st.randoms(use_true_random=False), value=st.one_of(st.just(...), json_values))
    def run(rng, value):
        case = mutate(dialect, bases[dialect], rng, value)
        sent.append(case.stream)
        _check(conn, dialect, case)

    run()
    assert env.proxy.stats()["errors_5xx"] == errors_5xx
    assert len(sent) >= EXAMPLES and 0 < sum(sent) < len(sent)  # streamed and not


def test_malformed_admin_calls_get_4xx_and_leave_sane_state(env):
    sid, _ = env.proxy.open_session({"harness": "fuzz-admin"})
    conn = Conn(env.proxy.url, env.proxy.admin_token)
    core = env.proxy.core
    sent = []

    @settings(FUZZ, max_examples=200)
    @given(rng=st.randoms(use_true_random=False), value=st.one_of(st.just(...), json_values))
    def run(rng, value):
        method, path, body, note = admin_case(rng, sid, value)
        sent.append(path)
        r, addr = conn.send(method, path, body)
        assert not admin_problems(r.status_code, r.text), f"{note}: {r.status_code} {r.text[:200]}"
        g, addr2 = conn.send("GET", "/admin/stats", b"")
        assert g.status_code == 200 and addr2 == addr, note
        v = core.policy_version
        assert v is None or (type(v) is int and 0 <= v < 2 ** 63), note
        for s in core.sessions.values():
            assert all(type(k) is str for k in s.meta), note
            for k in ("max_calls", "max_tokens", "staleness_limit", "start_version", "group_id"):
                x = s.meta.get(k)
                assert x is None or (type(x) is int and 0 <= x < 2 ** 63), note
        t = env.proxy.trajectory(sid)
        assert t.reward is None or math.isfinite(t.reward), note

    run()
    assert len(sent) >= 200


# -- the reproduced cases, exactly -----------------------------------------------------------
CHAT = [
    ({"messages": [{"role": ["user"], "content": "a"}]}, "messages[0].role"),
    ({"messages": [{"role": {"a": 1}, "content": "a"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "b"}}]},
                   {"role": "tool", "content": "x", "tool_call_id": ["c"]}]}, "messages[1].tool_call_id"),
    ({"stream_options": ["include_usage"]}, "stream_options"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"tools": 5}, "tools"),
    ({"tools": {"function": {"name": "x"}}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "b", "parameters": "{}"}}]}, "tools[0].function.parameters"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 5]}, "stop[1]"),
    ({"temperature": "0.7"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": [1]}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"max_tokens": "100"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": True}, "max_completion_tokens"),
    ({"seed": 2 ** 64 - 1}, "seed"),
    ({"seed": "1"}, "seed"),
    ({"n": 2}, "n"),
    ({"n": "1"}, "n"),
    ({"stream": "false"}, "stream"),
    ({"model": 5}, "model"),
    ({"model": "m" * 600}, "model"),
    ({"messages": [{"role": "u" * 100, "content": "a"}]}, "messages[0].role"),
    ({"tool_choice": 5}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "a"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "b", "arguments": "[" * 50000 + "]" * 50000}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("patch,param", CHAT, ids=[p for _, p in CHAT])
def test_chat_field_errors_name_the_field(env, patch, param, stream):
    conn = _session(env)
    body = {**GOOD["openai_chat"], "stream": stream, **patch}
    r, _ = conn.send("POST", "/v1/chat/completions", json.dumps(body).encode())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert param.split(".")[-1].split("[")[0] in err["message"]


ANTHROPIC = [
    ({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "a"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": {"x": 1}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
    ({"stop_sequences": "STOP"}, "stop_sequences"),
    ({"stop_sequences": [1]}, "stop_sequences[0]"),
    ({"tools": "bash"}, "tools"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": "5"}, "top_k"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"system": 5}, "system"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": "x", "input": {}}]}]},
     "messages[0].content[0].id"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": []}]}]},
     "messages[0].content[0].input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["t"]}]}]},
     "messages[0].content[0].tool_use_id"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("patch,param", ANTHROPIC, ids=[p for _, p in ANTHROPIC])
def test_anthropic_field_errors_name_the_field(env, patch, param, stream):
    conn = _session(env)
    body = {**GOOD["anthropic_messages"], "stream": stream, **patch}
    r, _ = conn.send("POST", "/v1/messages", json.dumps(body).encode())
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(param), err


RESPONSES = [
    ({"input": [{"type": "message", "role": ["user"], "content": "a"}]}, "input[0].role"),
    ({"input": [{"type": 5}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "b", "call_id": 7, "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "name": "b", "call_id": "c", "arguments": 7}]}, "input[0].arguments"),
    ({"instructions": ["be brief"]}, "instructions"),
    ({"tools": [{"type": "function", "name": ["b"]}]}, "tools[0].name"),
    ({"max_output_tokens": "9"}, "max_output_tokens"),
    ({"top_p": 1.5}, "top_p"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("patch,param", RESPONSES, ids=[p for _, p in RESPONSES])
def test_responses_field_errors_name_the_field(env, patch, param, stream):
    conn = _session(env)
    body = {**GOOD["openai_responses"], "stream": stream, **patch}
    r, _ = conn.send("POST", "/v1/responses", json.dumps(body).encode())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_policy_output_nested_past_the_json_parser_is_flagged_not_raised():
    """The policy's own text reaches the tool-call parser: nesting deep enough to exhaust
    Python's JSON decoder must flag the call, never fail it (a failed call is not scored)."""
    from harnessrl.gym.proxy.canonical import Tool
    from harnessrl.gym.proxy.toolcalls import HermesToolFormat

    deep = "[" * 5000 + "]" * 5000
    tools = [Tool("bash")]
    nested = '{"a": ' * 100 + "1" + "}" * 100  # parses, but a request may not carry it back
    for text in (f"<tool_call>{deep}</tool_call>", f'<tool_call>{{"name": "bash", "arguments": "{deep}"}}</tool_call>',
                 f'<tool_call>{{"name": "bash", "arguments": {nested}}}</tool_call>'):
        parsed = HermesToolFormat().parse(text, tools)
        assert parsed.tool_calls == [] and parsed.content == text
        assert parsed.flag in ("tool_call_bad_json", "tool_call_bad_arguments")


def test_deep_nesting_is_a_400_not_a_recursion_error(env):
    conn = _session(env)
    deep: object = {}
    for _ in range(900):
        deep = {"p": deep}
    body = dict(GOOD["openai_chat"], tools=[{"type": "function", "function": {"name": "t", "parameters": deep}}])
    r, _ = conn.send("POST", "/v1/chat/completions", json.dumps(body).encode())
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("tools[0].function.parameters.p.p")


def test_oversized_body_is_a_413_and_the_connection_stays(env):
    conn = _session(env)
    r, addr = conn.send("POST", "/v1/chat/completions", b" " * (env.proxy.config.max_body_bytes + 1))
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    g, addr2 = conn.send("POST", "/v1/chat/completions", json.dumps(GOOD["openai_chat"]).encode())
    assert g.status_code == 200 and addr2 == addr


ADMIN_BAD = [
    ("/admin/sessions/{sid}/reward", {"reward": "nan"}, 400),
    ("/admin/sessions/{sid}/reward", {"reward": "1.0"}, 400),
    ("/admin/sessions/{sid}/reward", {"reward": True}, 400),
    ("/admin/sessions/{sid}/reward", {"reward": 1.0, "status": 5}, 400),
    ("/admin/sessions/{sid}/reward", {"reward": 1.0, "termination": {"a": 1}}, 400),
    ("/admin/policy_version", {"version": 2 ** 64 - 1}, 400),
    ("/admin/policy_version", {"version": 2 ** 63}, 400),
    ("/admin/policy_version", {"version": -1}, 400),
    ("/admin/policy_version", {"version": 1.0}, 400),
    ("/admin/sessions", {"meta": [1, 2]}, 400),
    ("/admin/sessions", {"meta": {"max_calls": "5"}}, 400),
    ("/admin/sessions", {"meta": {"staleness_limit": 2 ** 64 - 1}}, 400),
    ("/admin/sessions", {"meta": {"start_version": -3}}, 400),
    ("/admin/sessions", [1], 400),
]


@pytest.mark.parametrize("path,body,status", ADMIN_BAD, ids=[f"{p.rsplit('/', 1)[-1]}-{b}" for p, b, _ in ADMIN_BAD])
def test_admin_refuses_bad_values(env, path, body, status):
    sid, _ = env.proxy.open_session({"harness": "admin"})
    conn = Conn(env.proxy.url, env.proxy.admin_token)
    before = env.proxy.core.policy_version
    r, _ = conn.send("POST", path.format(sid=sid), json.dumps(body).encode())
    assert r.status_code == status, r.text
    assert env.proxy.trajectory(sid).reward is None and env.proxy.core.policy_version == before


def test_admin_accepts_good_values_and_limits_body_size(env):
    sid, _ = env.proxy.open_session({"harness": "admin"})
    conn = Conn(env.proxy.url, env.proxy.admin_token)
    r, _ = conn.send("POST", f"/admin/sessions/{sid}/reward", b'{"reward": 1, "status": "ok"}')
    assert r.status_code == 200 and env.proxy.trajectory(sid).reward == 1.0
    r, _ = conn.send("POST", "/admin/policy_version", json.dumps({"version": 2 ** 63 - 1}).encode())
    assert r.status_code == 200 and env.proxy.core.policy_version == 2 ** 63 - 1
    r, _ = conn.send("POST", "/admin/sessions", json.dumps({"meta": {"max_calls": 3, "task_id": "t"}}).encode())
    assert r.status_code == 200
    big = json.dumps({"meta": {"x": "a" * env.proxy.config.admin_max_body_bytes}}).encode()
    r, addr = conn.send("POST", "/admin/sessions", big)
    assert r.status_code == 413
    g, addr2 = conn.send("GET", "/admin/stats", b"")
    assert g.status_code == 200 and addr2 == addr


@pytest.mark.parametrize("host,ok", [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
                                     ("::ffff:127.0.0.1", True), ("localhost", False), ("10.0.0.1", False),
                                     ("::ffff:10.0.0.1", False), ("", False), ("127.0.0.1.evil", False),
                                     ("fe80::1%eth0", False)])
def test_loopback_is_decided_by_address(host, ok):
    from starlette.datastructures import Address

    from harnessrl.gym.proxy.admin import is_loopback

    assert is_loopback(Address(host, 1234)) is ok
    assert is_loopback(None) is False  # a unix-socket client has no address: not loopback


@pytest.mark.parametrize("dialect", list(DIALECT_PATHS))
def test_a_streamed_prompt_the_engine_refuses_is_a_400_not_an_error_event(dialect):
    """The engine's refusal (the prompt outgrew its context) comes before the stream's 200."""
    from harnessrl.gym.doubles.standin import StandinEngine
    from harnessrl.gym.proxy import ProxyConfig, ProxyServer
    from proxy_helpers import ServedApp

    eng = StandinEngine(max_context=200)
    with ServedApp(eng.app()) as e, ProxyServer(ProxyConfig(engine_url=e.url), tokenizer=load_tokenizer("tiny-llama")) as p:
        sid, key = p.open_session({})
        conn = Conn(f"{p.url}/s/{sid}", key)
        long = {**GOOD[dialect], "stream": True}
        text = "word " * 400
        if dialect == "openai_responses":
            long["input"] = text
        elif dialect == "gemini":
            long = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
        else:
            long["messages"] = [{"role": "user", "content": text}]
        r, addr = conn.send("POST", path_of(dialect, True), json.dumps(long).encode())
        assert r.status_code == 400 and "do not fit the context" in r.text, r.text
        assert e.url not in r.text and e.url.split("//")[1] not in r.text  # the agent is not told where the engine is
        assert "text/event-stream" not in r.headers.get("content-type", "")
        good = GOOD[dialect] if dialect == "gemini" else {**GOOD[dialect], "stream": True}
        g, addr2 = conn.send("POST", path_of(dialect, True), json.dumps(good).encode())
        assert g.status_code == 200 and addr2 == addr and not problems(dialect, Case(dialect, {"stream": True}, ""),
                                                                         200, {}, g.text)


def test_count_tokens_refuses_bad_fields_and_counts_good_ones(env):
    conn = _session(env)
    r, _ = conn.send("POST", "/v1/messages/count_tokens", b'{"messages": [{"role": "user", "content": [{"type": 5}]}]}')
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages[0].content[0].type")
    r, _ = conn.send("POST", "/v1/messages/count_tokens", b"[1]")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r, _ = conn.send("POST", "/v1/messages/count_tokens", json.dumps(GOOD["anthropic_messages"]).encode())
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
