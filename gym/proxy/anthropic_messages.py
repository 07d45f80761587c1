"""Anthropic Messages (`/v1/messages`, `?beta=true` ignored): request -> ChatRequest,
Completion -> a message body or its SSE event sequence (message_start, content_block_*,
message_delta, message_stop).

`system` may be a string or text blocks; `role:"system"` entries inside `messages` (Claude
Code) are system turns in place; a user turn's `tool_result` blocks become tool messages
ahead of its text; `thinking` blocks carry no prompt text (the policy produced none).
"""
from __future__ import annotations

import json
from typing import Any

from .canonical import ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps, text_of
from .errors import bad_request

DIALECT = "anthropic_messages"
_SKIP = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "container_upload"}


def _blocks(role: str, content: Any, where: str) -> list[Message]:
    if isinstance(content, str):
        return [Message(role, content)]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    text: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for j, b in enumerate(content):
        w = f"{where}.content[{j}]"
        t = b.get("type") if isinstance(b, dict) else None
        if t == "text":
            if not isinstance(b.get("text"), str):
                raise bad_request(f"{w}.text must be a string", f"{w}.text")
            text.append(b["text"])
        elif t == "tool_use" and role == "assistant":
            if not isinstance(b.get("name"), str) or not b.get("id"):
                raise bad_request(f"{w}: tool_use needs 'id' and 'name'", w)
            calls.append(ToolCall(str(b["id"]), b["name"], json.dumps(b.get("input") or {})))
        elif t == "tool_result" and role == "user":
            if not b.get("tool_use_id"):
                raise bad_request(f"{w}: tool_result needs 'tool_use_id'", w)
            body = text_of(b.get("content"), f"{w}.content")
            results.append(Message("tool", body, tool_call_id=str(b["tool_use_id"])))
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


def parse(body: dict) -> ChatRequest:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list", "messages")
    messages: list[Message] = []
    system = body.get("system")
    if system:
        messages.append(Message("system", text_of(system, "system")))
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"{where}.role {role!r} is not one of user, assistant, system", f"{where}.role")
        if role == "system":
            messages.append(Message("system", text_of(m.get("content"), f"{where}.content")))
        else:
            messages.extend(_blocks(role, m.get("content"), where))
    check_tool_results(messages, "messages")
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        if not isinstance(t, dict):
            raise bad_request(f"tools[{i}] must be an object", f"tools[{i}]")
        if "input_schema" not in t and t.get("type") not in (None, "custom"):
            continue  # server tools (web_search_..., bash_...) the local policy cannot serve
        if not isinstance(t.get("name"), str):
            raise bad_request(f"tools[{i}].name is required", f"tools[{i}].name")
        tools.append(Tool(t["name"], t.get("description") or "", t.get("input_schema") or {}))
    stop = [s for s in (body.get("stop_sequences") or []) if isinstance(s, str) and s]
    return ChatRequest(
        dialect=DIALECT, model=str(body.get("model") or ""), messages=messages, tools=tools,
        tool_choice=body.get("tool_choice"), max_tokens=body.get("max_tokens"),
        temperature=body.get("temperature"), top_p=body.get("top_p"), top_k=body.get("top_k"),
        stop=stop, stream=bool(body.get("stream")),
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
