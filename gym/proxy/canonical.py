"""Dialect-neutral request and message types.

Every dialect module turns its wire body into a `ChatRequest` of `Message`s; the renderer,
recorder and tool-call format only ever see these. `Message.key()` is the canonical form
used to decide whether a new request extends the previous one: it ignores what does not
change the prompt tokens (tool-call ids, JSON formatting of arguments, surrounding
whitespace, `content: null` vs `""`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        """Compact JSON bytes (orjson when installed: SSE events are the per-token hot path)."""
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

ROLES = ("system", "user", "assistant", "tool")

MAX_STOP = 64
"""Most stop strings one request may name (each is searched for in every streamed chunk)."""

MAX_ID = 512
"""Longest model name or tool-call id accepted (they are echoed back, in replies and errors)."""


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text of the arguments object, as the harness or the parser gave it."""

    def key(self) -> tuple[str, str]:
        try:
            args = json.dumps(json.loads(self.arguments), sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            args = self.arguments.strip()
        return (self.name, args)

    def arguments_obj(self) -> Any:
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except (ValueError, RecursionError):
            return self.arguments


@dataclass(slots=True)
class Message:
    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def key(self) -> tuple:
        c = self.content
        if c and (c[0].isspace() or c[-1].isspace()):  # strip() copies: skip it when there is nothing to strip
            c = c.strip()
        if self.tool_calls:
            return (self.role, c, tuple(tc.key() for tc in self.tool_calls))
        return (self.role, c)


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=dict)

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(slots=True)
class ChatRequest:
    dialect: str
    """The dialect's name in `harnessrl.registry.DIALECTS` ("openai-chat", "anthropic", ...)."""
    model: str
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: Any = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    seed: int | None = None
    body_bytes: int = 0
    """Size of the HTTP body it came in (large ones render in the proxy's heavy lane, `offload`)."""

    def tools_key(self) -> str:
        if not self.tools:
            return ""
        return json.dumps([t.as_openai() for t in self.tools], sort_keys=True)


def text_of(content: Any, where: str, types: tuple[str, ...] = ("text", "input_text", "output_text")) -> str:
    """A message content that is a string, null, or a list of text parts, as one string."""
    if content.__class__ is str:
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                t = part.get("type")
                if t is not None and t.__class__ is not str:
                    raise bad_request(f"{where}[{i}].type must be a string", f"{where}[{i}].type")
                if t in types or (t is None and "text" in part):
                    txt = part.get("text")
                    if not isinstance(txt, str):
                        raise bad_request(f"{where}[{i}].text must be a string", f"{where}[{i}].text")
                    parts.append(txt)
                elif t in ("image_url", "input_image", "image", "input_audio", "file", "input_file", "document"):
                    raise bad_request(f"{where}[{i}]: content part type {t!r} is not supported (text only)",
                                      f"{where}[{i}].type")
                # other part types (thinking, cache markers, refusal...) carry no prompt text
            else:
                raise bad_request(f"{where}[{i}] must be a string or an object", f"{where}[{i}]")
        return "".join(parts) if len(parts) != 1 else parts[0]
    raise bad_request(f"{where} must be a string, null or a list of text parts", where)


def check_tool_results(messages: list[Message], where: str) -> None:
    """Every tool result answers a tool call made earlier in the same conversation."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        for tc in m.tool_calls:
            seen.add(tc.id)
        if m.role == "tool":
            if not m.tool_call_id:
                raise bad_request(f"{where}[{i}]: tool result has no tool call id", f"{where}[{i}]")
            if m.tool_call_id not in seen:
                raise bad_request(f"{where}[{i}]: tool result for {m.tool_call_id!r} matches no earlier "
                                  "tool call in this conversation", f"{where}[{i}]")


@dataclass(slots=True)
class Completion:
    """What one call produced, as every dialect formats it."""

    id: str
    model: str
    created: int
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    """"stop" (end of turn), "length" (max tokens), "tool_calls", or "stop_sequence"."""
    stop_sequence: str | None
    prompt_tokens: int
    completion_tokens: int

    def assistant_message(self) -> Message:
        """The reply as the harness will append it to its history."""
        return Message("assistant", self.content, tuple(self.tool_calls))
