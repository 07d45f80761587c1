"""A stand-in engine that speaks the engine contract (and a minimal OpenAI chat endpoint),
for tests and benchmarks. Not a model: its output is scripted or derived from the prompt.

- `POST /generate` (SGLang shape, written by `gym/backends/encode.py`; non-streamed and SSE;
  cumulative chunks like SGLang's default, or incremental): output ids come from `responder(input_ids) -> ids`; logprobs
  are a deterministic function of position; `weight_version` is settable.
- `POST /pause_generation {"mode":"abort"}` returns running requests with their partial
  output and finish reason `abort`; `/generate` calls made while paused wait for
  `/continue_generation`. `token_delay_s` > 0 makes generation take time so it can be
  interrupted.
- `POST /v1/chat/completions`: answers at once with a fixed reply (the "straight to the
  engine" and LiteLLM-upstream baseline of bench/proxy_overhead.py).
- Every /generate call is logged (`calls`: input ids, output ids, finish reason).
- `max_context`: prompts that long get the local engine's 400 (the context does not fit).

`python -m harnessrl.gym.doubles.standin --port N` serves it as its own process.
"""
from __future__ import annotations

import asyncio
import json

try:
    import orjson
    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads
import time
from dataclasses import dataclass, field
from typing import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from harnessrl.gym.backends.encode import finish_reason, sglang_reply


def default_responder(input_ids: list[int]) -> list[int]:
    """A few ids derived from the prompt (so crossed records show), then <|im_end|> (2)."""
    h = sum(input_ids[-16:]) * 2654435761 + len(input_ids)
    return [1000 + (h >> (4 * k)) % 7000 for k in range(5)] + [2]


@dataclass
class StandinEngine:
    responder: Callable[[list[int]], list[int]] = default_responder
    weight_version: str = "0"
    token_delay_s: float = 0.0
    incremental: bool = False
    max_context: int | None = None
    """Refuse (400, as the local engine does) prompts of at least this many tokens; None: no limit."""
    calls: list[dict] = field(default_factory=list)
    log_calls: bool = True
    _paused: asyncio.Event | None = None
    _abort_epoch: int = 0

    def _lp(self, i: int) -> float:
        return -0.01 * ((i % 97) + 1)

    async def _produce(self, req: dict):
        """Yields (new ids, finish) while generating, honouring pause/abort."""
        if self._paused is None:
            self._paused = asyncio.Event()
            self._paused.set()
        await self._paused.wait()
        sp = req.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        stops = set(sp.get("stop_token_ids") or []) | {2}
        ids = self.responder(list(req["input_ids"]))
        epoch = self._abort_epoch
        req["_version"] = self.weight_version  # weights cannot change under a running request
        out: list[int] = []
        for t in ids:
            if len(out) >= max_new:
                yield [], "length"
                return
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            if self._abort_epoch != epoch:
                yield [], "abort"
                return
            out.append(t)
            if t in stops:
                yield [t], "stop"
                return
            yield [t], ""
        yield [], "length" if len(out) >= max_new else "stop"

    def _body(self, req, ids, lps_start, finish, n_total):
        """One reply or chunk over `ids` (a bare finish reason: no matched token, no length)."""
        return sglang_reply(rid=req.get("rid") or "", output_ids=ids,
                            logprobs=[self._lp(lps_start + i) for i in range(len(ids))],
                            finish=finish_reason(finish), prompt_tokens=len(req["input_ids"]),
                            completion_tokens=n_total, weight_version=req.get("_version", self.weight_version))

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            req = _loads(await request.body())
            if self.max_context is not None and len(req["input_ids"]) >= self.max_context:
                msg = f"input_ids: {len(req['input_ids'])} tokens do not fit the context length {self.max_context}"
                return Response(json.dumps({"error": {"message": msg}}), status_code=400,
                                media_type="application/json")
            if not req.get("stream"):
                out, finish = [], ""
                async for new, fin in self._produce(req):
                    out += new
                    finish = fin or finish
                if self.log_calls:
                    self.calls.append({"input_ids": list(req["input_ids"]), "output_ids": out, "finish": finish,
                                       **({"priority": req["priority"]} if "priority" in req else {})})
                return Response(json.dumps(self._body(req, out, 0, finish, len(out))), media_type="application/json")

            async def events():
                out: list[int] = []
                finish = ""
                async for new, fin in self._produce(req):
                    start = len(out)
                    out += new
                    finish = fin
                    body = self._body(req, new, start, fin, len(out)) if self.incremental else \
                        self._body(req, list(out), 0, fin, len(out))
                    yield b"data: " + json.dumps(body).encode() + b"\n\n"
                if self.log_calls:
                    self.calls.append({"input_ids": list(req["input_ids"]), "output_ids": out, "finish": finish,
                                       **({"priority": req["priority"]} if "priority" in req else {})})
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        async def pause(request: Request) -> Response:
            if self._paused is None:
                self._paused = asyncio.Event()
            self._paused.clear()
            self._abort_epoch += 1
            return Response(b"{}", media_type="application/json")

        async def cont(request: Request) -> Response:
            if self._paused is None:
                self._paused = asyncio.Event()
            self._paused.set()
            return Response(b"{}", media_type="application/json")

        async def abort(request: Request) -> Response:
            self._abort_epoch += 1
            return Response(b"{}", media_type="application/json")

        async def health(request: Request) -> Response:
            return Response(b"ok")

        async def chat(request: Request) -> Response:
            body = _loads(await request.body())
            return Response(json.dumps({
                "id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "policy"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok, done"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}),
                media_type="application/json")

        return Starlette(routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/pause_generation", pause, methods=["POST"]),
            Route("/continue_generation", cont, methods=["POST"]),
            Route("/abort_request", abort, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
        ])


def main(argv=None) -> int:
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser(description="contract-speaking instant stand-in engine")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-context", type=int, default=None, help="refuse prompts of this many tokens or more")
    a = ap.parse_args(argv)
    eng = StandinEngine(log_calls=False, max_context=a.max_context)
    uvicorn.run(eng.app(), host="127.0.0.1", port=a.port, log_level="warning", http="httptools", loop="uvloop",
                backlog=4096)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
