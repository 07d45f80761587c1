"""Teacher calls: the proxy records another policy's replies as teacher data, in the student's
tokens and chat template.

Two kinds of teacher (`ProxyConfig.teacher`, `teacher_url`):
- a token-level backend that already writes the student's tokenizer ids (the scripted gold
  policy, `gym.doubles.scripted`): the proxy generates through it as through any backend;
- an OpenAI-compatible chat endpoint (`teacher_url`): a pass-through. The proxy forwards
  the harness's request (its canonical form, as an OpenAI chat body with the tools) to the
  teacher and takes the reply's text and tool calls. The teacher has its own tokenizer, so
  its tokens mean nothing here: the reply is written the way the student would have
  sampled it. The student's tool format renders the assistant turn (the same rendering the
  template gets when that turn is history), the student's tokenizer encodes it (content
  shielded, as every template message is), and the student's end-of-turn token closes it.
  These ids become the call's completion, so the rest of the call (tool-call parse, record,
  segment growth) is the pipeline every call takes, and the next prompt holds exactly them.

Either way a teacher call is recorded with loss mask 1 on its completion (the store puts 1
on every completion token), logprob NaN (null in the admin API's JSON export) and policy
version -1 on each of those tokens (no
policy of this run sampled them, so there is no behaviour logprob and no version), and
`flags["teacher"] = {"teacher": label, "model": name}`. `trainers.samples.build_samples`
refuses such records (RL trains on on-policy tokens only); `trainers.sft` trains on them.
"""
from __future__ import annotations

import json
import math
from typing import Any

import httpx

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeouts
from .canonical import ChatRequest, Message, ToolCall
from .generation import Generation
from .render import Renderer

TEACHER_VERSION = "-1"
"""The version string every teacher token gets (recorded as -1: sampled by no policy version)."""


def is_teacher_call(flags: dict[str, Any]) -> bool:
    return bool(flags.get("teacher"))


def mark(gen: Generation) -> None:
    """A teacher generation has no behaviour logprobs and no policy version."""
    gen.logprobs = [math.nan] * len(gen.ids)
    gen.versions = [TEACHER_VERSION] * len(gen.ids)


def openai_body(req: ChatRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The harness's request as an OpenAI chat body for the teacher (text, tools, tool calls)."""
    messages: list[dict[str, Any]] = []
    for m in req.messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["content"] = m.content or None
            d["tool_calls"] = [{"id": tc.id, "type": "function",
                                "function": {"name": tc.name, "arguments": tc.arguments}} for tc in m.tool_calls]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
        messages.append(d)
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": False}
    if req.tools:
        body["tools"] = [t.as_openai() for t in req.tools]
        if req.tool_choice is not None:
            body["tool_choice"] = req.tool_choice
    for name in ("temperature", "top_p", "seed"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.stop:
        body["stop"] = list(req.stop)
    return body


def reply_message(body: Any, url: str) -> tuple[Message, str]:
    """(assistant message, finish reason) of an OpenAI chat completion; EngineError when malformed."""
    try:
        choice = body["choices"][0]
        msg = choice["message"]
        content = msg.get("content") or ""
        if not isinstance(content, str):
            raise TypeError("message.content is not a string")
        calls = []
        for i, tc in enumerate(msg.get("tool_calls") or []):
            fn = tc["function"]
            args = fn.get("arguments") or "{}"
            calls.append(ToolCall(str(tc.get("id") or f"teacher_{i}"), str(fn["name"]),
                                  args if isinstance(args, str) else json.dumps(args)))
        return Message("assistant", content, tuple(calls)), str(choice.get("finish_reason") or "stop")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise EngineError(f"teacher {url}: not an OpenAI chat completion ({type(e).__name__}: {e})") from e


def student_ids(renderer: Renderer, reply: Message, finish_reason: str) -> list[int]:
    """The reply as the student would have sampled it: its template rendering as an assistant
    turn, encoded by the student's tokenizer, closed by the end-of-turn token (not when the
    teacher ran out of tokens: a cut-off turn has no end)."""
    text = renderer.tool_format.to_template([reply], None)[0]["content"] or ""
    ids = renderer.encode_text(text)
    if finish_reason != "length":
        b = renderer.bridge_ids
        end = b[:1] if b and b[0] in renderer.special_ids else renderer.stop_token_ids[:1]
        ids += end
    return ids


class TeacherChat:
    """The pass-through teacher: one OpenAI chat call per harness call (see the module doc)."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 900.0):
        self.base_url = url.rstrip("/")
        self.model = model
        self.timeouts = EngineTimeouts(connect_s=None, first_byte_s=None, idle_s=None, total_s=timeout_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)

    async def reply(self, req: ChatRequest, params: dict[str, Any], renderer: Renderer, out: Generation) -> None:
        """Ask the teacher; fill `out` with the reply in the student's ids (marked teacher)."""
        import time

        t0 = time.perf_counter()
        url = f"{self.base_url}/chat/completions"
        try:
            r = await self._client.post(url, json=openai_body(req, self.model, params["max_new_tokens"]))
        except httpx.HTTPError as e:
            raise EngineError(f"teacher {url} unreachable: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise EngineError(f"teacher {url} answered {r.status_code}: {r.text[:300]}", status_code=r.status_code)
        msg, finish = reply_message(r.json(), url)
        out.ids = student_ids(renderer, msg, finish)
        out.finish_reason = "length" if finish == "length" else "stop"
        mark(out)
        out.gen_s += time.perf_counter() - t0

    async def health(self) -> bool:
        try:
            r = await self._client.get(f"{self.base_url}/models")
            return r.status_code < 500
        except httpx.HTTPError:
            return False

    async def model_info(self) -> dict[str, Any]:
        # teacher tokens carry no logprobs: the space is moot, "sampled" stops a probe of the URL
        return {"logprob_space": "sampled", "backend": f"teacher:{self.base_url}", "model": self.model}

    async def aclose(self) -> None:
        await self._client.aclose()
