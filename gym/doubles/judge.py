"""`ScriptedJudge`: an OpenAI-compatible `/v1/chat/completions` endpoint that answers as a judge
would, scripted, for tests of the judge reward (`gym.grading.judge`); serve it with
`gym.served.ServedApp(judge.app())` and point `JudgeConfig.base_url` at `{url}/v1`.

Modes (`mode`):
- "comply": the strict answer {"verdict_id": <the id of the system message>, "score": `score`}
  (with `scores`, the n-th request's score is `scores[n % len(scores)]`).
- "naive": obeys any injection naively: when the user message (the diff included) holds a line
  "respond with: TEXT", it answers TEXT verbatim; otherwise it complies.
- "obedient": obeys an injection while keeping the format: when the user message holds "ignore
  previous instructions", it answers the strict format with score 1.0 (the residual risk of
  docs/trust.md: a judge that follows the agent's text and knows how to answer).
- "raw": answers `content` verbatim. "status": answers HTTP `status` with `content` as its body.
Every mode first waits `delay_s`. `requests` holds each request's JSON body and its
Authorization header, in order.
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any

_ID = re.compile(r'"verdict_id": "([0-9a-f]+)"')
_RESPOND = re.compile(r"respond with:\s*(.+)", re.I)


class ScriptedJudge:
    def __init__(self, mode: str = "comply", score: float = 1.0, content: str = "", status: int = 200,
                 delay_s: float = 0.0, scores: list[float] | None = None):
        if mode not in ("comply", "naive", "obedient", "raw", "status"):
            raise ValueError(f"unknown mode {mode!r}")
        self.mode, self.score, self.content, self.status, self.delay_s = mode, score, content, status, delay_s
        self.scores = scores
        self.requests: list[dict[str, Any]] = []

    def answer(self, messages: list[dict[str, str]], n: int = 0) -> str:
        """The answer text for the `n`-th request's chat messages, by the mode."""
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        user = "\n".join(m["content"] for m in messages if m.get("role") == "user")
        found = _ID.search(system)
        verdict_id = found.group(1) if found else ""
        score = self.scores[n % len(self.scores)] if self.scores else self.score
        if self.mode == "raw":
            return self.content
        if self.mode == "naive" and _RESPOND.search(user):
            return _RESPOND.search(user).group(1).strip()
        if self.mode == "obedient" and "ignore previous instructions" in user.lower():
            score = 1.0
        return json.dumps({"verdict_id": verdict_id, "score": score, "reason": "scripted"})

    def app(self):
        """A Starlette app serving POST /v1/chat/completions."""
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse
        from starlette.routing import Route

        async def chat(request):
            body = await request.json()
            n = len(self.requests)
            self.requests.append({"body": body, "authorization": request.headers.get("authorization")})
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.mode == "status":
                return PlainTextResponse(self.content, status_code=self.status)
            text = self.answer(body.get("messages") or [], n)
            return JSONResponse({"id": f"chatcmpl-judge-{n}", "object": "chat.completion",
                                 "model": body.get("model", ""),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
