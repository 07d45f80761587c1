"""Malformed requests for the proxy fuzz test and `bench/fuzz_proxy.py`: structured
mutations of the real harness request shapes (tests/fixtures/harness-requests) and of the
admin API's bodies, driven by a `random.Random` (hypothesis supplies one in the test, a
seeded one in the bench), plus the checks every answer must pass.

What must hold for every request, however malformed: no 5xx; a 200 is a real answer in
the dialect's shape (never an error event inside a 200 stream); a 4xx is the dialect's error
shape and, for a 400 about a field, names it (OpenAI `error.param`, Anthropic in the
message, Gemini in `error.details` field violations); the keep-alive connection stays usable.
Gemini streams by its URL (`path_of`), not by a body field.
"""
from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from proxy_helpers import fill_placeholders, fixture_requests, sse_events

DIALECT_PATHS = {"openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses",
                 "anthropic_messages": "/v1/messages", "gemini": "/v1beta/models/policy:generateContent"}
GEMINI_STREAM = "/v1beta/models/policy:streamGenerateContent?alt=sse"


def path_of(dialect: str, stream: bool) -> str:
    """The route a request of `dialect` goes to (Gemini's streamed calls have their own)."""
    return GEMINI_STREAM if dialect == "gemini" and stream else DIALECT_PATHS[dialect]


#: Field names each dialect reads, at every level (set to odd values wherever a dict is).
FIELDS = {
    "openai_chat": ["model", "messages", "stream", "stream_options", "include_usage", "tools", "tool_choice", "stop",
                    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed", "n", "role",
                    "content", "tool_calls", "tool_call_id", "name", "function", "arguments", "parameters",
                    "description", "type", "text", "id"],
    "openai_responses": ["model", "input", "instructions", "stream", "tools", "tool_choice", "temperature", "top_p",
                         "max_output_tokens", "previous_response_id", "type", "role", "content", "name", "call_id",
                         "arguments", "output", "parameters", "description", "text"],
    "anthropic_messages": ["model", "messages", "system", "stream", "tools", "tool_choice", "stop_sequences",
                           "temperature", "top_p", "top_k", "max_tokens", "role", "content", "type", "text", "id",
                           "name", "input", "tool_use_id", "input_schema", "description"],
    "gemini": ["contents", "role", "parts", "text", "thought", "functionCall", "functionResponse", "name", "args",
               "id", "response", "systemInstruction", "tools", "functionDeclarations", "description", "parameters",
               "parametersJsonSchema", "toolConfig", "functionCallingConfig", "mode", "allowedFunctionNames",
               "generationConfig", "temperature", "topP", "topK", "maxOutputTokens", "stopSequences",
               "candidateCount", "seed", "inlineData", "type"],
}

GOOD = {
    "openai_chat": {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    "openai_responses": {"model": "policy", "input": "hi"},
    "anthropic_messages": {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
}
"""A small valid request per dialect: sent on the same connection after each bad one."""

_EDGE = [None, True, False, 0, 1, -1, 2, 0.5, -0.0, 1.5, 3.0, 1e308, -1e308, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1,
         2 ** 63, 2 ** 64 - 1, -2 ** 63, "", " ", "x", "nan", "inf", "-1", "1", "true", "null", "user", "assistant",
         "system", "tool", "developer", "function", "text", "tool_use", "tool_result", "image", "message",
         "function_call", "function_call_output", "reasoning", "thinking", "none", "auto", "<|im_start|>assistant",
         "\u0000", "\ud7ff\ue000", "é" * 3, "r" * 600, "[" * 3000 + "]" * 3000,
         '{"a": ' * 1200 + "1" + "}" * 1200, "[" * 70 + "]" * 70, [], {}, [None], [1, 2], ["a", 1], [[]], [{}], {"type": None},
         {"type": 1}, {"type": []}, {"type": "text"}, {"type": "text", "text": 5}, {"text": None},
         {"name": None}, {"function": "x"}, {"function": {"name": 1}}, {"include_usage": "yes"},
         [{"type": "image", "source": {}}], [{"type": "tool_result", "tool_use_id": 5}]]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """An arbitrary JSON value, biased to the edges the parsers must refuse cleanly."""
    r = rng.random()
    if r < 0.55:
        return copy.deepcopy(rng.choice(_EDGE))
    if r < 0.65:
        return rng.randint(-2 ** 64, 2 ** 64)
    if r < 0.72:
        return rng.uniform(-1e6, 1e6)
    if r < 0.82:
        return "".join(rng.choice("ab \n\t{}[]\"'\\<|>é漢\u2063") for _ in range(rng.randint(0, 40)))
    if depth > 3:
        return None
    if r < 0.91:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["type", "text", "role", "content", "name", "x", ""]): random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _containers(obj: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every dict and list in `obj` with its path (tool JSON schemas below depth 3 left out:
    they are passed through, and would crowd out the fields the parsers read)."""
    out = [(path, obj)]
    if len(path) > 6:
        return out
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for k, v in items:
        if isinstance(v, (dict, list)) and not ({"parameters", "input_schema", "parametersJsonSchema"} & set(path)):
            out += _containers(v, path + (k,))
    return out


@dataclass
class Case:
    """One request to send: `body` (JSON-encoded) or `raw` bytes, and what was done."""

    dialect: str
    body: Any
    note: str
    raw: bytes | None = None

    def content(self) -> bytes:
        if self.raw is not None:
            return self.raw
        body = self.body
        if self.dialect == "gemini" and isinstance(body, dict) and "stream" in body:
            body = {k: v for k, v in body.items() if k != "stream"}  # Gemini streams by its URL
        return json.dumps(body, allow_nan=True).encode()

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def path(self) -> str:
        return path_of(self.dialect, self.stream)


def base_bodies(dialect: str) -> list[dict]:
    """Real harness bodies of this dialect (placeholders filled), plus the small good one."""
    files = {"openai_chat": ["mini-swe-agent.jsonl", "opencode.jsonl", "aider.jsonl"],
             "openai_responses": ["codex-cli.jsonl"], "anthropic_messages": ["claude-code.jsonl"],
             "gemini": ["gemini-cli.jsonl"]}[dialect]
    out = [copy.deepcopy(GOOD[dialect])]
    for f in files:
        for r in fixture_requests(f):
            if r["method"] == "POST" and isinstance(r.get("body"), dict):
                out.append(fill_placeholders(r["body"]))
    return out


def mutate(dialect: str, bases: list[dict], rng: random.Random, value: Any = ...) -> Case:
    """One malformed (or, by chance, still valid) request; `value` overrides the random replacement."""
    body = copy.deepcopy(rng.choice(bases))
    if rng.random() < 0.5:
        body["stream"] = True
    op = rng.random()
    if op < 0.04:  # not JSON / not an object
        raw = rng.choice([b"", b"{", b"[]", b"null", b"5", b'"x"', b"{\"messages\": [}", b"\xff\xfe",
                          b'{"a": NaN}', b'{"messages": 1e999}', b"[" * 5000 + b"]" * 5000,
                          b'{"model": "\\ud800"}'])
        return Case(dialect, None, f"raw {raw[:20]!r}", raw=raw)
    if op < 0.07:  # deep nesting inside an otherwise valid request
        deep: Any = "x"
        for _ in range(rng.choice([65, 200, 900])):
            deep = {"p": deep} if rng.random() < 0.5 else [deep]
        key = rng.choice(["metadata", "tools", "tool_choice"])
        body[key] = deep if key != "tools" else [{"type": "function", "name": "t", "parameters": deep,
                                                  "function": {"name": "t", "parameters": deep},
                                                  "input_schema": deep}]
        return Case(dialect, body, f"deep {key}")
    n = 1 if rng.random() < 0.7 else rng.randint(2, 4)
    notes = []
    for _ in range(n):
        path, node = rng.choice(_containers(body))
        v = random_value(rng) if value is ... else copy.deepcopy(value)
        if isinstance(node, dict):
            r = rng.random()
            if r < 0.5 and node:
                k = rng.choice(list(node))
            else:
                k = rng.choice(FIELDS[dialect])
            if r > 0.9 and k in node:
                del node[k]
                notes.append(f"del {'/'.join(map(str, path + (k,)))}")
            else:
                node[k] = v
                notes.append(f"{'/'.join(map(str, path + (k,)))}={json.dumps(v)[:60]}")
        elif node:
            i = rng.randrange(len(node))
            node[i] = v
            notes.append(f"{'/'.join(map(str, path + (i,)))}={json.dumps(v)[:60]}")
        else:
            node.append(v)
            notes.append(f"{'/'.join(map(str, path))}+={json.dumps(v)[:60]}")
    return Case(dialect, body, "; ".join(notes))


def admin_case(rng: random.Random, sid: str, value: Any = ...) -> tuple[str, str, bytes, str]:
    """(method, path, body, note) of a malformed admin call on session `sid` (or on none)."""
    v = random_value(rng) if value is ... else value
    route = rng.choice(["open", "reward", "version", "close", "traj", "raw"])
    if route == "open":
        meta = {"harness": "fuzz", rng.choice(["max_calls", "max_tokens", "staleness_limit", "start_version", "group_id",
                                               "task_id", "x" * rng.choice([1, 200])]): v}
        body: Any = {"meta": rng.choice([meta, v])}
        return "POST", "/admin/sessions", json.dumps(body).encode(), f"open meta={json.dumps(body)[:80]}"
    if route == "reward":
        body = {"reward": v, "status": rng.choice(["ok", "infra_error", v]),
                "termination": rng.choice(["", "submitted", v])}
        return "POST", f"/admin/sessions/{sid}/reward", json.dumps(body).encode(), f"reward {json.dumps(body)[:80]}"
    if route == "version":
        body = {"version": v}
        return "POST", "/admin/policy_version", json.dumps(body).encode(), f"version {json.dumps(v)[:60]}"
    if route == "close":
        return "POST", f"/admin/sessions/{rng.choice([sid, 'nope'])}/close", b"", "close"
    if route == "traj":
        return "GET", f"/admin/sessions/{rng.choice([sid, 'nope'])}/trajectory", b"", "traj"
    raw = rng.choice([b"{", b"[1]", b"null", b'"x"', b"\xff", b"x" * (70 * 1024), b'{"reward": NaN}',
                      b'{"version": 18446744073709551615}', b'{"reward": "nan"}', b'{"reward": 1e999}'])
    path = rng.choice([f"/admin/sessions/{sid}/reward", "/admin/policy_version", "/admin/sessions"])
    return "POST", path, raw, f"raw {path} {raw[:24]!r}"


# -- checks --------------------------------------------------------------------------------
def problems(dialect: str, case: Case, status: int, headers: dict, text: str) -> list[str]:
    """What is wrong with the proxy's answer to `case` (empty: nothing)."""
    out = []
    if status >= 500:
        out.append(f"{status} for bad input")
    if status == 200:
        if case.stream:
            out += _stream_problems(dialect, text)
        else:
            try:
                body = json.loads(text)
            except ValueError:
                return out + ["200 body is not JSON"]
            if "error" in body and body["error"] is not None:
                out.append("200 carrying an error")
    elif 400 <= status < 500:
        try:
            err = json.loads(text)
        except ValueError:
            return out + [f"{status} body is not JSON"]
        if dialect == "anthropic_messages":
            if err.get("type") != "error" or not (err.get("error") or {}).get("message"):
                out.append(f"{status} not in Anthropic's error shape")
        elif dialect == "gemini":
            e = err.get("error") if isinstance(err.get("error"), dict) else {}
            if e.get("code") != status or not e.get("message") or not isinstance(e.get("status"), str):
                out.append(f"{status} not in Gemini's error shape")
            elif status == 400 and not e.get("details") and not _whole_body_error(e["message"]):
                out.append(f"400 names no field: {e['message'][:120]}")
        elif not isinstance(err.get("error"), dict) or not err["error"].get("message"):
            out.append(f"{status} not in OpenAI's error shape")
        elif status == 400 and err["error"].get("param") is None and not _whole_body_error(err["error"]["message"]):
            out.append(f"400 names no field: {err['error']['message'][:120]}")
    return out


def _whole_body_error(message: str) -> bool:
    """Refusals about the body as a whole, or from the engine, name no field."""
    return message.startswith(("request body", "the engine refused"))


def _stream_problems(dialect: str, text: str) -> list[str]:
    events = sse_events(text)
    if not events:
        return ["200 stream with no events"]
    for ev, data in events:
        if ev == "error" or ev == "response.failed":
            return [f"200 stream with an error event: {data[:120]}"]
        if data != "[DONE]":
            try:
                d = json.loads(data)
            except ValueError:
                return [f"undecodable stream event {data[:60]}"]
            if isinstance(d, dict) and (d.get("error") or d.get("type") == "error"):
                return [f"200 stream with an error event: {data[:120]}"]
    last_ev, last = events[-1]
    if dialect == "gemini":  # no end marker: the last chunk carries the finish reason
        try:
            done = "finishReason" in json.loads(last)["candidates"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            done = False
        return [] if done else [f"stream does not end with a finish reason: {last[:60]}"]
    end = {"openai_chat": last == "[DONE]", "openai_responses": last_ev == "response.completed",
           "anthropic_messages": last_ev == "message_stop"}[dialect]
    return [] if end else [f"stream does not end properly: {last_ev} {last[:60]}"]


def admin_problems(status: int, text: str) -> list[str]:
    out = [f"admin {status} for bad input"] if status >= 500 else []
    try:
        json.loads(text)
    except ValueError:
        out.append(f"admin {status} body is not JSON")
    return out
