"""Anthropic Messages (`/v1/messages`, `?beta=true` ignored): request -> ChatRequest,
Completion -> a message body or its SSE event sequence (message_start, content_block_*,
message_delta, message_stop).

`system` may be a string or text blocks; `role:"system"` entries inside `messages` (Claude
Code) are system turns in place; a user turn's `tool_result` blocks become tool messages
ahead of its text; `thinking` blocks carry no prompt text (the policy produced none).
Every field read is type- and range-checked (`fields`); a bad one is a 400 whose message
names it (Anthropic errors carry no `param`).
"""
from __future__ import annotations

import json
from typing import Any

from . import fields as F
from .canonical import MAX_ID, MAX_STOP, ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps, text_of
from .errors import bad_request

DIALECT = "anthropic"
"""Its name in `harnessrl.registry.DIALECTS`."""
ID_PREFIX = "msg_"
"""How the ids of its replies begin."""
_SKIP = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "container_upload"}


def _blocks(role: str, content: Any, where: str) -> list[Message]:
    if content.__class__ is str:
        return [Message(role, content)]
    if content.__class__ is not list:
        raise bad_request(f"{where}.content must be a string or a list of content blocks, got {F.kind(content)}",
                          f"{where}.content")
    text: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for j, b in enumerate(content):
        w = f"{where}.content[{j}]"
        if b.__class__ is not dict:
            raise bad_request(f"{w} must be a content block object, got {F.kind(b)}", w)
        t = F.string(b, "type", w, required=True, max_len=64)
        if t == "text":
            text.append(F.string(b, "text", w, required=True))
        elif t == "tool_use" and role == "assistant":
            tid, name = F.string(b, "id", w, required=True, max_len=MAX_ID), F.string(b, "name", w, required=True)
            calls.append(ToolCall(tid, name, json.dumps(F.obj(b, "input", w) or {})))
        elif t == "tool_result" and role == "user":
            tid = F.string(b, "tool_use_id", w, required=True, max_len=MAX_ID)
            results.append(Message("tool", text_of(b.get("content"), f"{w}.content"), tool_call_id=tid))
        elif t in _SKIP:
            continue
        elif t in ("image", "document", "search_result"):
            raise bad_request(f"{w}: content block type {t!r} is not supported (text only)", f"{w}.type")
        else:
            raise bad_request(f"{w}: content block type {t!r} is not valid in a {role} turn", f"{w}.type")
    out = results
    if role == "assistant":
        out.append(Message("assistant", "".join(text), tuple(calls)))
    elif text or not results:
        out.append(Message(role, "".join(text)))
    return out


def _tools(body: dict) -> list[Tool]:
    tools = []
    for w, t in F.objects(body, "tools"):
        kind = F.string(t, "type", w)
        if "input_schema" not in t and kind not in (None, "custom"):
            continue  # server tools (web_search_..., bash_...) the local policy cannot serve
        tools.append(Tool(F.string(t, "name", w, required=True), F.string(t, "description", w) or "",
                          F.obj(t, "input_schema", w) or {}))
    return tools


def parse(body: dict) -> ChatRequest:
    if not F.array(body, "messages"):
        raise bad_request("'messages' must be a non-empty list", "messages")
    messages: list[Message] = []
    system = text_of(body.get("system"), "system")
    if system:
        messages.append(Message("system", system))
    for where, m in F.objects(body, "messages"):
        role = F.string(m, "role", where, required=True, max_len=64)
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"{where}.role {role!r} is not one of user, assistant, system", f"{where}.role")
        if role == "system":
            messages.append(Message("system", text_of(m.get("content"), f"{where}.content")))
        else:
            messages.extend(_blocks(role, m.get("content"), where))
    check_tool_results(messages, "messages")
    return ChatRequest(
        dialect=DIALECT, model=F.string(body, "model", max_len=MAX_ID) or "", messages=messages, tools=_tools(body),
        tool_choice=F.obj(body, "tool_choice"), max_tokens=F.integer(body, "max_tokens", lo=1),
        temperature=F.number(body, "temperature", lo=0.0, hi=1.0), top_p=F.number(body, "top_p", lo=0.0, hi=1.0),
        top_k=F.integer(body, "top_k", lo=0, hi=2 ** 31 - 1),
        stop=F.stop_list(body, "stop_sequences", max_items=MAX_STOP, single=False),
        stream=bool(F.boolean(body, "stream")),
    )


_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}


def _tool_id(tc: ToolCall) -> str:
    return "toolu_" + tc.id.removeprefix("call_")


def _usage(c: Completion | None, prompt_tokens: int = 0) -> dict:
    return {"input_tokens": c.prompt_tokens if c else prompt_tokens, "output_tokens": c.completion_tokens if c else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def response(req: ChatRequest, c: Completion) -> dict:
    content: list[dict] = [{"type": "text", "text": c.content}] if (c.content or not c.tool_calls) else []
    content += [{"type": "tool_use", "id": _tool_id(tc), "name": tc.name, "input": tc.arguments_obj()}
                for tc in c.tool_calls]
    return {"id": c.id, "type": "message", "role": "assistant", "model": c.model, "content": content,
            "stop_reason": _STOP[c.finish_reason], "stop_sequence": c.stop_sequence, "usage": _usage(c)}


class Stream:
    """Messages SSE events of one call; the text block opens at the first text."""

    media_type = "text/event-stream"

    def __init__(self, req: ChatRequest, mid: str, model: str, created: int):
        self.req, self.mid, self.model = req, mid, model
        self.block = -1
        self.text_open = False

    @staticmethod
    def _ev(type_: str, **fields) -> bytes:
        return b"event: " + type_.encode() + b"\ndata: " + dumps({"type": type_, **fields}) + b"\n\n"

    def start(self) -> bytes:
        msg = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": _usage(None)}
        return self._ev("message_start", message=msg) + self._ev("ping")

    def _open_text(self) -> bytes:
        self.block += 1
        self.text_open = True
        return self._ev("content_block_start", index=self.block, content_block={"type": "text", "text": ""})

    def text(self, delta: str) -> bytes:
        head = b"" if self.text_open else self._open_text()
        return head + self._ev("content_block_delta", index=self.block, delta={"type": "text_delta", "text": delta})

    def finish(self, c: Completion, rest: str) -> bytes:
        out = [self.text(rest)] if rest else []
        if not self.text_open and not c.tool_calls:
            out.append(self._open_text())
        if self.text_open:
            out.append(self._ev("content_block_stop", index=self.block))
        for tc in c.tool_calls:
            self.block += 1
            out += [self._ev("content_block_start", index=self.block,
                             content_block={"type": "tool_use", "id": _tool_id(tc), "name": tc.name, "input": {}}),
                    self._ev("content_block_delta", index=self.block,
                             delta={"type": "input_json_delta", "partial_json": tc.arguments}),
                    self._ev("content_block_stop", index=self.block)]
        out.append(self._ev("message_delta", delta={"stop_reason": _STOP[c.finish_reason],
                                                    "stop_sequence": c.stop_sequence}, usage=_usage(c)))
        out.append(self._ev("message_stop"))
        return b"".join(out)

    def keepalive(self) -> bytes:
        return self._ev("ping")

    def error(self, status: int, message: str) -> bytes:
        return self._ev("error", error={"type": "api_error", "message": message})


def error_body(status: int, message: str, kind: str, param: str | None) -> dict:
    kinds = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
             529: "overloaded_error"}
    return {"type": "error", "error": {"type": kinds.get(status, kind if status < 500 else "api_error"),
                                       "message": message}}
