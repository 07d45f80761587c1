"""Gemini API (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`):
request -> ChatRequest, Completion -> a GenerateContentResponse or its SSE chunks.

The model and whether to stream come from the URL (`parse(body, model, stream)`), not the
body. `contents` are user/model turns of `parts`: `text` (a `thought: true` part carries no
prompt text), `functionCall` (model turns) and `functionResponse` (user turns, which become
tool messages ahead of the turn's text). A call without an `id` is matched by its function
name to the first later response of that name, as Gemini pairs them; every response must
answer an earlier call. `systemInstruction` is a system turn; `tools[].functionDeclarations`
take `parameters` (OpenAPI subset: upper-case type names, lowered here) or
`parametersJsonSchema`; other tool kinds (search, code execution) are skipped. Every field
read is type- and range-checked (`fields`), unknown ones are ignored, and a bad one is a 400
in Gemini's shape (`{"error": {"code", "message", "status"}}`) whose message starts with the
field's path and whose `details` carry it as a `BadRequest` field violation.
"""
from __future__ import annotations

import json
from typing import Any

from . import fields as F
from .canonical import MAX_ID, MAX_STOP, ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps
from .errors import ProxyError, bad_request

DIALECT = "gemini"
"""Its name in `harnessrl.registry.DIALECTS`."""
ID_PREFIX = "gen-"
"""How the ids of its replies begin."""
_MODES = {"AUTO": "auto", "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto", "ANY": "required", "NONE": "none"}
_UNSUPPORTED = ("inlineData", "fileData", "executableCode", "codeExecutionResult", "videoMetadata")


class _Pairing:
    """Tool-call ids across one conversation: calls without an id get `<name>#<n>`; a response
    names its call by id, or by function name (the oldest unanswered call of that name)."""

    def __init__(self) -> None:
        self.open: list[ToolCall] = []
        self.n = 0

    def call(self, name: str, cid: str | None) -> str:
        self.n += 1
        return cid or f"{name}#{self.n}"

    def answer(self, name: str, rid: str | None) -> str | None:
        """The id of the call this response answers (None: it answers none)."""
        for i, tc in enumerate(self.open):
            if rid is not None and tc.id == rid:
                return self.open.pop(i).id
        for i, tc in enumerate(self.open):
            if tc.name == name:
                return self.open.pop(i).id
        return None


def _text(part: dict, w: str) -> str | None:
    if F.boolean(part, "thought", w):
        F.string(part, "text", w)
        return None
    return F.string(part, "text", w)


def _response_text(resp: dict | None) -> str:
    """A function response's `response` object as the tool message text: the one string it
    holds under output/result/content (Gemini CLI's `{"output": ...}`), else compact JSON."""
    if not resp:
        return ""
    if len(resp) == 1:
        (k, v), = resp.items()
        if k in ("output", "result", "content") and v.__class__ is str:
            return v
    return json.dumps(resp, ensure_ascii=False, separators=(",", ":"))


def _turn(role: str, parts: list, where: str, pair: _Pairing) -> list[Message]:
    text: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for j, p in enumerate(parts):
        w = f"{where}.parts[{j}]"
        if p.__class__ is not dict:
            raise bad_request(f"{w} must be a part object, got {F.kind(p)}", w)
        fc, fr = F.obj(p, "functionCall", w), F.obj(p, "functionResponse", w)
        if fc is not None:
            if role != "model":
                raise bad_request(f"{w}.functionCall is only valid in a model turn", f"{w}.functionCall")
            w += ".functionCall"
            name = F.string(fc, "name", w, required=True, max_len=MAX_ID)
            cid = pair.call(name, F.string(fc, "id", w, max_len=MAX_ID))
            tc = ToolCall(cid, name, json.dumps(F.obj(fc, "args", w) or {}))
            calls.append(tc)
            pair.open.append(tc)
        elif fr is not None:
            if role != "user":
                raise bad_request(f"{w}.functionResponse is only valid in a user turn", f"{w}.functionResponse")
            w += ".functionResponse"
            name = F.string(fr, "name", w, required=True, max_len=MAX_ID)
            rid = pair.answer(name, F.string(fr, "id", w, max_len=MAX_ID))
            if rid is None:
                raise bad_request(f"{w}: the response to {name!r} answers no earlier functionCall of this "
                                  "conversation", w)
            results.append(Message("tool", _response_text(F.obj(fr, "response", w)), tool_call_id=rid, name=name))
        elif "text" in p:
            t = _text(p, w)
            if t is not None:
                text.append(t)
        else:
            bad = next((k for k in _UNSUPPORTED if k in p), None)
            if bad is not None:
                raise bad_request(f"{w}.{bad} is not supported (text and function parts only)", f"{w}.{bad}")
            raise bad_request(f"{w} has no text, functionCall or functionResponse", w)
    if role == "model":
        return [Message("assistant", "".join(text), tuple(calls))]
    return results + ([Message("user", "".join(text))] if text or not results else [])


def _parts(content: dict, where: str) -> list:
    parts = F.array(content, "parts", where)
    if not parts:
        raise bad_request(f"{F.path(where, 'parts')} must be a non-empty array of parts", F.path(where, "parts"))
    return parts


def _system(body: dict) -> str:
    si = body.get("systemInstruction")
    if si is None or si.__class__ is str:
        return si or ""
    if si.__class__ is not dict:
        raise bad_request(f"systemInstruction must be a Content object or a string, got {F.kind(si)}",
                          "systemInstruction")
    out = []
    for j, p in enumerate(_parts(si, "systemInstruction")):
        w = f"systemInstruction.parts[{j}]"
        if p.__class__ is not dict:
            raise bad_request(f"{w} must be a part object, got {F.kind(p)}", w)
        t = _text(p, w)
        if t is not None:
            out.append(t)
        elif not p.get("thought"):
            raise bad_request(f"{w}.text is required (a system instruction is text)", f"{w}.text")
    return "\n".join(out)  # one line per part


def _openapi_to_json_schema(s: Any) -> Any:
    """Gemini's OpenAPI-subset schema as JSON Schema: its enum type names ("STRING", "OBJECT")
    lower-cased, everything else as given."""
    if s.__class__ is dict:
        return {k: (v.lower() if k == "type" and v.__class__ is str else _openapi_to_json_schema(v))
                for k, v in s.items()}
    if s.__class__ is list:
        return [_openapi_to_json_schema(v) for v in s]
    return s


def _tools(body: dict) -> list[Tool]:
    tools = []
    for w, t in F.objects(body, "tools"):
        for wd, d in F.objects(t, "functionDeclarations", w):
            schema = F.obj(d, "parametersJsonSchema", wd)
            if schema is None:
                schema = _openapi_to_json_schema(F.obj(d, "parameters", wd) or {})
            tools.append(Tool(F.string(d, "name", wd, required=True, max_len=MAX_ID),
                              F.string(d, "description", wd) or "", schema))
    return tools


def _tool_choice(body: dict) -> str | None:
    fcc = F.obj(F.obj(body, "toolConfig") or {}, "functionCallingConfig", "toolConfig")
    if fcc is None:
        return None
    w = "toolConfig.functionCallingConfig"
    mode = F.string(fcc, "mode", w, max_len=64)
    for i, n in enumerate(F.array(fcc, "allowedFunctionNames", w) or []):
        if n.__class__ is not str:
            raise bad_request(f"{w}.allowedFunctionNames[{i}] must be a string, got {F.kind(n)}",
                              f"{w}.allowedFunctionNames[{i}]")
    if mode is None:
        return None
    if mode not in _MODES:
        raise bad_request(f"{w}.mode {mode!r} is not one of {', '.join(_MODES)}", f"{w}.mode")
    return _MODES[mode]


def parse(body: dict, model: str = "", stream: bool = False) -> ChatRequest:
    """`body` of a generateContent call to `model` (from the URL); `stream` for streamGenerateContent."""
    if not F.array(body, "contents"):
        raise bad_request("contents must be a non-empty array of Content objects", "contents")
    messages: list[Message] = []
    system = _system(body)
    if system:
        messages.append(Message("system", system))
    pair = _Pairing()
    for where, c in F.objects(body, "contents"):
        role = F.string(c, "role", where, max_len=64) or "user"
        if role not in ("user", "model"):
            raise bad_request(f"{where}.role {role!r} is not one of user, model", f"{where}.role")
        messages.extend(_turn(role, _parts(c, where), where, pair))
    check_tool_results(messages, "contents")
    g = F.obj(body, "generationConfig") or {}
    gw = "generationConfig"
    if g.get("candidateCount") is not None and F.integer(g, "candidateCount", gw) != 1:
        raise bad_request(f"{gw}.candidateCount: only 1 candidate is supported", f"{gw}.candidateCount")
    stop = F.stop_list({f"{gw}.stopSequences": g.get("stopSequences")}, f"{gw}.stopSequences",
                       max_items=MAX_STOP, single=False)
    return ChatRequest(
        dialect=DIALECT, model=model, messages=messages, tools=_tools(body), tool_choice=_tool_choice(body),
        max_tokens=F.integer(g, "maxOutputTokens", gw, lo=1),
        temperature=F.number(g, "temperature", gw, lo=0.0, hi=2.0), top_p=F.number(g, "topP", gw, lo=0.0, hi=1.0),
        top_k=F.integer(g, "topK", gw, lo=0, hi=2 ** 31 - 1), stop=stop, stream=stream,
        seed=F.integer(g, "seed", gw),
    )


def count_request(body: dict) -> dict:
    """A countTokens body as the generateContent body it counts: `generateContentRequest`
    when given, else the body itself (`contents`)."""
    inner = F.obj(body, "generateContentRequest")
    return body if inner is None else inner


def split_target(target: str) -> tuple[str, str]:
    """`policy:generateContent` (the URL's last segment) -> ("policy", "generateContent")."""
    model, sep, method = target.rpartition(":")
    if not sep or not model:
        raise bad_request(f"the URL names no method: want models/{{model}}:generateContent, got {target!r}", "model")
    if len(model) > MAX_ID:
        raise bad_request(f"model is {len(model)} characters; at most {MAX_ID} are accepted", "model")
    return model, method


def request_parser(target: str, alt: str | None):
    """The body parser of a call to `models/{target}` (`policy:generateContent`,
    `policy:streamGenerateContent` with `alt=sse`); a method not served is a 404."""
    model, method = split_target(target)
    if method not in ("generateContent", "streamGenerateContent"):
        raise ProxyError(404, f"method {method!r} is not served here (generateContent, streamGenerateContent, "
                         "countTokens)", kind="not_found_error")
    if method == "streamGenerateContent" and alt != "sse":
        raise ProxyError(400, "streamGenerateContent is served as server-sent events only: add ?alt=sse", param="alt")
    stream = method == "streamGenerateContent"
    return lambda body: parse(body, model, stream)


# -- replies -----------------------------------------------------------------------------
def _finish(c: Completion) -> str:
    return "MAX_TOKENS" if c.finish_reason == "length" else "STOP"


def _usage(c: Completion) -> dict:
    return {"promptTokenCount": c.prompt_tokens, "candidatesTokenCount": c.completion_tokens,
            "totalTokenCount": c.prompt_tokens + c.completion_tokens}


def _call_parts(c: Completion) -> list[dict]:
    return [{"functionCall": {"id": tc.id, "name": tc.name, "args": _args(tc)}} for tc in c.tool_calls]


def _args(tc: ToolCall) -> dict:
    a = tc.arguments_obj()
    return a if a.__class__ is dict else {}  # the parser only keeps calls whose arguments are an object


def _candidate(parts: list[dict], finish: str | None = None) -> dict:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        cand["finishReason"] = finish
    return cand


def response(req: ChatRequest, c: Completion) -> dict:
    parts = [{"text": c.content}] if (c.content or not c.tool_calls) else []
    return {"candidates": [_candidate(parts + _call_parts(c), _finish(c))], "usageMetadata": _usage(c),
            "modelVersion": c.model, "responseId": c.id}


class Stream:
    """`data:` chunks of one streamed call, each a GenerateContentResponse; the last carries
    the function calls, `finishReason` and `usageMetadata` (Gemini sends no end marker)."""

    media_type = "text/event-stream"

    def __init__(self, req: ChatRequest, cid: str, model: str, created: int):
        self.req, self.cid, self.model = req, cid, model

    def _chunk(self, body: dict) -> bytes:
        return b"data: " + dumps(dict(body, modelVersion=self.model, responseId=self.cid)) + b"\n\n"

    def start(self) -> bytes:
        return b""  # Gemini's first chunk already carries text; the rendered prompt needs no event

    def text(self, delta: str) -> bytes:
        return self._chunk({"candidates": [_candidate([{"text": delta}])]})

    def finish(self, c: Completion, rest: str) -> bytes:
        parts = ([{"text": rest}] if rest or not (c.tool_calls or c.content) else []) + _call_parts(c)
        return self._chunk({"candidates": [_candidate(parts, _finish(c))], "usageMetadata": _usage(c)})

    def keepalive(self) -> bytes:
        # A blank line, not an SSE comment: the Google GenAI SDK's reader skips leading
        # whitespace but only matches a buffer that starts with `data: `; Gemini CLI 0.61 given
        # `: keep-alive` fails the call ("Incomplete JSON segment at the end").
        return b"\n"

    def error(self, status: int, message: str) -> bytes:
        return b"data: " + dumps(error_body(status, message, "api_error", None)) + b"\n\n"


_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
           500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def error_body(status: int, message: str, kind: str, param: str | None) -> dict:
    err: dict[str, Any] = {"code": status, "message": message,
                           "status": _STATUS.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")}
    if param is not None:
        err["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                           "fieldViolations": [{"field": param, "description": message}]}]
    return {"error": err}
