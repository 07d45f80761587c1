"""OpenAI Chat Completions (`/v1/chat/completions`): request -> ChatRequest, Completion ->
response body or SSE chunks. Unknown fields are ignored; only what changes the prompt or
sampling is read."""
from __future__ import annotations

import json
from typing import Any

from .canonical import ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps, text_of
from .errors import bad_request

DIALECT = "openai_chat"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise bad_request(f"{where} must be a list", where)
    out = []
    for i, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{i}].function.name is required", f"{where}[{i}]")
        args = fn.get("arguments", "{}")
        out.append(ToolCall(str(tc.get("id") or f"call_{i}"), fn["name"],
                            args if isinstance(args, str) else json.dumps(args)))
    return tuple(out)


def parse(body: dict) -> ChatRequest:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list", "messages")
    messages: list[Message] = []
    for i, m in enumerate(msgs):
        if m.__class__ is not dict:
            raise bad_request(f"messages[{i}] must be an object", f"messages[{i}]")
        role = _ROLES.get(m.get("role"))
        where = f"messages[{i}]"
        if role is None:
            raise bad_request(f"{where}.role {m.get('role')!r} is not one of system, developer, user, "
                              "assistant, tool", f"{where}.role")
        content = m.get("content")
        if content.__class__ is not str:
            content = text_of(content, f"{where}.content")
        if role == "assistant":
            messages.append(Message("assistant", content, _tool_calls(m.get("tool_calls"), f"{where}.tool_calls")))
        elif role == "tool":
            messages.append(Message("tool", content, tool_call_id=m.get("tool_call_id") or m.get("name"),
                                    name=m.get("name")))
        else:
            messages.append(Message(role, content))
    check_tool_results(messages, "messages")
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{i}].function.name is required", f"tools[{i}]")
        tools.append(Tool(fn["name"], fn.get("description") or "", fn.get("parameters") or {}))
    n = body.get("n")
    if n not in (None, 1):
        raise bad_request("only n=1 is supported", "n")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str) and s]
    so = body.get("stream_options") or {}
    return ChatRequest(
        dialect=DIALECT, model=str(body.get("model") or ""), messages=messages, tools=tools,
        tool_choice=body.get("tool_choice"),
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        temperature=body.get("temperature"), top_p=body.get("top_p"), top_k=body.get("top_k"),
        stop=stop, stream=bool(body.get("stream")), include_usage=bool(so.get("include_usage")),
        seed=body.get("seed"),
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
