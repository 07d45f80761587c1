"""Tool formats for chat templates that have no tool support of their own.

A `ToolFormat` does three things: put the tool list into the prompt, write earlier tool
calls and tool results as plain chat messages the template understands, and parse a
completion's text back into content + tool calls. Parsing never raises: a malformed or
truncated call leaves the whole text as content and says why in `ParsedCompletion.flag`;
the sampled tokens are recorded unchanged either way.

Formats are registered by short name (`TOOL_FORMATS`, name -> "module:Class"); a full
"module:Class" path is accepted too.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Protocol

from harnessrl.registry import choice, resolve

from .canonical import Message, Tool, ToolCall
from .errors import ProxyError
from .fields import check_depth


@dataclass(slots=True)
class ParsedCompletion:
    content: str
    tool_calls: list[ToolCall]
    flag: str | None = None
    """None when parsing was clean; else e.g. "tool_call_truncated", "tool_call_bad_json"."""


class ToolFormat(Protocol):
    start_marker: str
    """Text that opens a tool call; streaming holds text back from here on."""

    def to_template(self, messages: list[Message], tools: list[Tool] | None) -> list[dict]:
        """Canonical messages as `{role, content}` dicts for the chat template; when `tools`
        is given (the first render of a conversation) the tool list goes into the system turn."""

    def parse(self, text: str, tools: list[Tool]) -> ParsedCompletion:
        """Split a completion into content and tool calls (never raises)."""


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class HermesToolFormat:
    """Hermes / Qwen2.5 style: tools as JSON inside `<tools>` in the system turn, calls as
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, results as a user turn of
    `<tool_response>` blocks (consecutive results share one turn)."""

    start_marker = "<tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def tools_text(self, tools: list[Tool]) -> str:
        lines = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name "
            "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def to_template(self, messages: list[Message], tools: list[Tool] | None) -> list[dict]:
        out: list[dict] = []
        for m in messages:
            if m.role == "tool":
                block = f"<tool_response>\n{m.content}\n</tool_response>"
                if out and out[-1].get("_tool"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool": True})
            elif m.role == "assistant" and m.tool_calls:
                parts = [m.content.strip()] if m.content.strip() else []
                for tc in m.tool_calls:
                    call = {"name": tc.name, "arguments": tc.arguments_obj()}
                    parts.append(f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>")
                out.append({"role": "assistant", "content": "\n".join(parts)})
            else:
                out.append({"role": m.role, "content": m.content})
        for d in out:
            d.pop("_tool", None)
        if tools:
            text = self.tools_text(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def parse(self, text: str, tools: list[Tool]) -> ParsedCompletion:
        if self.start_marker not in text:
            return ParsedCompletion(text, [])
        calls: list[ToolCall] = []
        for body in self._block.findall(text):
            try:
                obj = json.loads(body.strip())
            except (ValueError, RecursionError):  # the policy's text: nested past the parser's depth too
                return ParsedCompletion(text, [], "tool_call_bad_json")
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return ParsedCompletion(text, [], "tool_call_no_name")
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    return ParsedCompletion(text, [], "tool_call_bad_arguments")
            if not isinstance(args, dict) or _too_deep(args):
                return ParsedCompletion(text, [], "tool_call_bad_arguments")
            calls.append(ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False)))
        rest = self._block.sub("", text)
        if self.start_marker in rest:  # an opened call that never closed: cut by max_tokens/stop
            return ParsedCompletion(text, [], "tool_call_truncated")
        flag = None
        known = {t.name for t in tools}
        if known and any(c.name not in known for c in calls):
            flag = "tool_call_unknown_tool"
        return ParsedCompletion(rest.strip(), calls, flag)


def _too_deep(args: dict) -> bool:
    """Arguments nested past what a request may carry (`fields.MAX_DEPTH`): the harness would
    send them back in its next request, which would then be refused."""
    try:
        check_depth(args)
    except ProxyError:
        return True
    return False


#: Registered tool formats: short name -> "module:Class".
TOOL_FORMATS: dict[str, str] = {
    "hermes": "harnessrl.gym.proxy.toolcalls:HermesToolFormat",
    "qwen": "harnessrl.gym.proxy.toolcalls:HermesToolFormat",
}


#: A tool format as a config field (`ProxyConfig.tool_format`): a `TOOL_FORMATS` name or a
#: "module:Class" path, refused at validation time otherwise, with the valid names.
ToolFormatName = choice(TOOL_FORMATS, "tool format")


def load_tool_format(name: str) -> ToolFormat:
    return resolve(TOOL_FORMATS, name, "tool format")()
