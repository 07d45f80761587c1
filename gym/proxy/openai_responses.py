"""OpenAI Responses (`/v1/responses`): input items -> ChatRequest, Completion -> a response
object or its SSE event sequence (`response.created`, `response.output_item.added`,
`response.output_text.delta`, ..., `response.completed`), as Codex CLI requires.

`developer` messages are system turns; an assistant message followed by `function_call`
items is one assistant turn (that is how the proxy returned it); `reasoning` items carry
no prompt text. The proxy keeps no server-side state (`store` is ignored), so
`previous_response_id` is refused with a clear message. Every field read is type- and
range-checked (`fields`); a bad one is a 400 whose `param` names it.
"""
from __future__ import annotations

from typing import Any

from . import fields as F
from .canonical import MAX_ID, ChatRequest, Completion, Message, Tool, ToolCall, check_tool_results, dumps, text_of
from .errors import bad_request

DIALECT = "openai-responses"
"""Its name in `harnessrl.registry.DIALECTS`."""
ID_PREFIX = "resp_"
"""How the ids of its replies begin."""
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _item(item: Any, where: str, messages: list[Message]) -> None:
    """Append what one input item adds to the conversation."""
    if item.__class__ is not dict:
        raise bad_request(f"{where} must be an object, got {F.kind(item)}", where)
    t = F.string(item, "type", where, max_len=64) or ("message" if "role" in item else None)
    if t == "message":
        r = F.string(item, "role", where, required=True, max_len=64)
        role = _ROLES.get(r)
        if role is None:
            raise bad_request(f"{where}.role {r!r} is not one of system, developer, user, assistant", f"{where}.role")
        messages.append(Message(role, text_of(item.get("content"), f"{where}.content")))
    elif t == "function_call":
        name, cid = F.string(item, "name", where, required=True), F.string(item, "call_id", where, required=True, max_len=MAX_ID)
        args = F.json_args(item, "arguments", where)
        tc = ToolCall(cid, name, "{}" if args is None else args)
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":
            last.tool_calls = last.tool_calls + (tc,)
        else:
            messages.append(Message("assistant", "", (tc,)))
    elif t == "function_call_output":
        out = item.get("output")
        text = out if out.__class__ is str else text_of(out, f"{where}.output")
        messages.append(Message("tool", text, tool_call_id=F.string(item, "call_id", where, max_len=MAX_ID) or ""))
    elif t in ("reasoning", "item_reference"):
        return
    else:
        raise bad_request(f"{where}.type {t!r} is not supported (message, function_call, "
                          "function_call_output, reasoning)", f"{where}.type")


def _tools(body: dict) -> list[Tool]:
    tools = []
    for w, t in F.objects(body, "tools"):
        if (F.string(t, "type", w) or "function") != "function":
            continue  # built-in tools (web_search, ...) cannot be served by a local policy
        tools.append(Tool(F.string(t, "name", w, required=True), F.string(t, "description", w) or "",
                          F.obj(t, "parameters", w) or {}))
    return tools


def parse(body: dict) -> ChatRequest:
    if body.get("previous_response_id"):
        raise bad_request("previous_response_id is not supported: send the whole conversation in 'input' "
                          "(the proxy stores no responses)", "previous_response_id")
    raw = body.get("input")
    if raw.__class__ is str:
        raw = [{"type": "message", "role": "user", "content": raw}]
    if raw.__class__ is not list or not raw:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    messages: list[Message] = []
    instructions = F.string(body, "instructions")
    if instructions:
        messages.append(Message("system", instructions))
    for i, item in enumerate(raw):
        _item(item, f"input[{i}]", messages)
    check_tool_results(messages, "input")
    return ChatRequest(
        dialect=DIALECT, model=F.string(body, "model", max_len=MAX_ID) or "", messages=messages, tools=_tools(body),
        tool_choice=F.str_or_obj(body, "tool_choice"), max_tokens=F.integer(body, "max_output_tokens", lo=1),
        temperature=F.number(body, "temperature", lo=0.0, hi=2.0), top_p=F.number(body, "top_p", lo=0.0, hi=1.0),
        stream=bool(F.boolean(body, "stream")),
    )


def _msg_item(mid: str, text: str, status: str) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}


def _fc_item(tc: ToolCall, status: str) -> dict:
    return {"type": "function_call", "id": "fc_" + tc.id.removeprefix("call_"), "call_id": tc.id,
            "name": tc.name, "arguments": tc.arguments if status == "completed" else "", "status": status}


def _response(req: ChatRequest, rid: str, model: str, created: int, status: str, output: list,
              c: Completion | None) -> dict:
    body: dict[str, Any] = {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None, "incomplete_details": None, "instructions": None,
        "parallel_tool_calls": True, "tool_choice": req.tool_choice or "auto", "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
             "strict": False} for t in req.tools],
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_tokens,
        "store": False, "text": {"format": {"type": "text"}}, "metadata": {}, "usage": None,
    }
    if c is not None:
        if c.finish_reason == "length":
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["usage"] = {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                         "total_tokens": c.prompt_tokens + c.completion_tokens,
                         "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}
    return body


def _output(c: Completion) -> list[dict]:
    out = [_msg_item("msg_" + c.id[5:], c.content, "completed")] if (c.content or not c.tool_calls) else []
    return out + [_fc_item(tc, "completed") for tc in c.tool_calls]


def response(req: ChatRequest, c: Completion) -> dict:
    return _response(req, c.id, c.model, c.created, "completed", _output(c), c)


class Stream:
    """The Responses event stream of one call; the message item opens at the first text."""

    media_type = "text/event-stream"

    def __init__(self, req: ChatRequest, rid: str, model: str, created: int):
        self.req, self.rid, self.model, self.created = req, rid, model, created
        self.seq = 0
        self.mid = "msg_" + rid[5:]
        self.text_sent = ""
        self.msg_open = False

    def _ev(self, type_: str, **fields) -> bytes:
        fields = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + type_.encode() + b"\ndata: " + dumps(fields) + b"\n\n"

    def start(self) -> bytes:
        r = _response(self.req, self.rid, self.model, self.created, "in_progress", [], None)
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    def _open(self) -> bytes:
        self.msg_open = True
        return (self._ev("response.output_item.added", output_index=0, item=_msg_item(self.mid, "", "in_progress"))
                + self._ev("response.content_part.added", item_id=self.mid, output_index=0, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": []}))

    def text(self, delta: str) -> bytes:
        head = b"" if self.msg_open else self._open()
        self.text_sent += delta
        return head + self._ev("response.output_text.delta", item_id=self.mid, output_index=0, content_index=0,
                               delta=delta, logprobs=[])

    def finish(self, c: Completion, rest: str) -> bytes:
        out = []
        if rest:
            out.append(self.text(rest))
        elif not self.msg_open and (c.content or not c.tool_calls):
            out.append(self._open())
        idx = 0
        if self.msg_open:
            text = self.text_sent
            part = {"type": "output_text", "text": text, "annotations": []}
            out += [self._ev("response.output_text.done", item_id=self.mid, output_index=0, content_index=0,
                             text=text, logprobs=[]),
                    self._ev("response.content_part.done", item_id=self.mid, output_index=0, content_index=0,
                             part=part),
                    self._ev("response.output_item.done", output_index=0, item=_msg_item(self.mid, text, "completed"))]
            idx = 1
        items = ([_msg_item(self.mid, self.text_sent, "completed")] if self.msg_open else [])
        for tc in c.tool_calls:
            item = _fc_item(tc, "completed")
            out += [self._ev("response.output_item.added", output_index=idx, item=_fc_item(tc, "in_progress")),
                    self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=idx,
                             delta=tc.arguments),
                    self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                             arguments=tc.arguments),
                    self._ev("response.output_item.done", output_index=idx, item=item)]
            items.append(item)
            idx += 1
        r = _response(self.req, self.rid, self.model, self.created, "completed", items, c)
        # Always `response.completed` (Codex exits 1 without it); `status` says incomplete on length.
        out.append(self._ev("response.completed", response=r))
        return b"".join(out)

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"  # an SSE comment: clients skip it, idle timers reset

    def error(self, status: int, message: str) -> bytes:
        return self._ev("error", code=str(status), message=message, param=None)


def error_body(status: int, message: str, kind: str, param: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
