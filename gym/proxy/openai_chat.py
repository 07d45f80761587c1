"""OpenAI Chat Completions (`/v1/chat/completions`): request -> ChatRequest, Completion ->
response body or SSE chunks. Unknown fields are ignored; every field that changes the prompt
or sampling is type- and range-checked (`fields`), a bad one is a 400 whose `param` names it."""
from __future__ import annotations

from typing import Any

from . import fields as F
from .canonical import MAX_ID, MAX_STOP, ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps, text_of
from .errors import bad_request

DIALECT = "openai-chat"
"""Its name in `harnessrl.registry.DIALECTS`."""
ID_PREFIX = "chatcmpl-"
"""How the ids of its replies begin."""
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}


def _tool_calls(m: dict, where: str) -> tuple[ToolCall, ...]:
    out = []
    for i, (w, tc) in enumerate(F.objects(m, "tool_calls", where)):
        fn = F.obj(tc, "function", w)
        if fn is None:
            raise bad_request(f"{w}.function is required", f"{w}.function")
        name = F.string(fn, "name", f"{w}.function", required=True)
        args = F.json_args(fn, "arguments", f"{w}.function")
        out.append(ToolCall(F.string(tc, "id", w, max_len=MAX_ID) or f"call_{i}", name, "{}" if args is None else args))
    return tuple(out)


def _message(m: dict, where: str) -> Message:
    r = F.string(m, "role", where, required=True, max_len=64)
    role = _ROLES.get(r)
    if role is None:
        raise bad_request(f"{where}.role {r!r} is not one of system, developer, user, assistant, tool",
                          f"{where}.role")
    content = m.get("content")
    if content.__class__ is not str:
        content = text_of(content, f"{where}.content")
    name = F.string(m, "name", where)
    if role == "assistant":
        return Message("assistant", content, _tool_calls(m, where))
    if role == "tool":
        return Message("tool", content, tool_call_id=F.string(m, "tool_call_id", where, max_len=MAX_ID) or name, name=name)
    return Message(role, content)


def _tools(body: dict) -> list[Tool]:
    tools = []
    for w, t in F.objects(body, "tools"):
        fn = F.obj(t, "function", w)
        if fn is None:
            raise bad_request(f"{w}.function is required", f"{w}.function")
        w += ".function"
        tools.append(Tool(F.string(fn, "name", w, required=True), F.string(fn, "description", w) or "",
                          F.obj(fn, "parameters", w) or {}))
    return tools


def parse(body: dict) -> ChatRequest:
    if not F.array(body, "messages"):
        raise bad_request("'messages' must be a non-empty list", "messages")
    messages = [_message(m, where) for where, m in F.objects(body, "messages")]
    check_tool_results(messages, "messages")
    if body.get("n") is not None and F.integer(body, "n") != 1:
        raise bad_request("only n=1 is supported", "n")
    so = F.obj(body, "stream_options") or {}
    max_tokens = F.integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = F.integer(body, "max_tokens", lo=1)
    return ChatRequest(
        dialect=DIALECT, model=F.string(body, "model", max_len=MAX_ID) or "", messages=messages, tools=_tools(body),
        tool_choice=F.str_or_obj(body, "tool_choice"), max_tokens=max_tokens,
        temperature=F.number(body, "temperature", lo=0.0, hi=2.0), top_p=F.number(body, "top_p", lo=0.0, hi=1.0),
        top_k=F.integer(body, "top_k", lo=-1, hi=2 ** 31 - 1),
        stop=F.stop_list(body, "stop", max_items=MAX_STOP, single=True), stream=bool(F.boolean(body, "stream")),
        include_usage=bool(F.boolean(so, "include_usage", "stream_options")), seed=F.integer(body, "seed"),
    )


def _finish(c: Completion) -> str:
    return "stop" if c.finish_reason == "stop_sequence" else c.finish_reason


def _tool_calls_out(c: Completion) -> list[dict]:
    return [{"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            for tc in c.tool_calls]


def _usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


def response(req: ChatRequest, c: Completion) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content if (c.content or not c.tool_calls) else None}
    if c.tool_calls:
        msg["tool_calls"] = _tool_calls_out(c)
    return {"id": c.id, "object": "chat.completion", "created": c.created, "model": c.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": _finish(c), "logprobs": None}],
            "usage": _usage(c)}


class Stream:
    """SSE chunks of one streamed chat completion."""

    media_type = "text/event-stream"

    def __init__(self, req: ChatRequest, cid: str, model: str, created: int):
        self.req, self.head = req, {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        body = dict(self.head, choices=[{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}])
        return b"data: " + dumps(body) + b"\n\n"

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str) -> bytes:
        return self._chunk({"content": delta})

    def finish(self, c: Completion, rest: str) -> bytes:
        out = [self._chunk({"content": rest})] if rest else []
        for i, tc in enumerate(_tool_calls_out(c)):
            out.append(self._chunk({"tool_calls": [dict(tc, index=i)]}))
        out.append(self._chunk({}, _finish(c)))
        if self.req.include_usage:
            out.append(b"data: " + dumps(dict(self.head, choices=[], usage=_usage(c))) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"  # an SSE comment: clients skip it, idle timers reset

    def error(self, status: int, message: str) -> bytes:
        return b"data: " + dumps({"error": {"message": message, "type": "server_error", "code": status}}) + b"\n\n"


def error_body(status: int, message: str, kind: str, param: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
