"""The engine behind the gymnasium env: the policy is whoever calls `SweEnv.step()`.

Contract: one Starlette app on 127.0.0.1 serves two things for one env:

- SGLang's /generate contract (plus /health, /get_model_info, /abort_request), so the real
  proxy generates through it unchanged. Instead of sampling, each /generate call becomes a
  `Turn` put on the env's event queue (the prompt ids, and the harness request that caused
  it); its reply is the completion the env hands to `Turn.answer` (from `step(action)`),
  written by the one encoder of that reply shape (`gym/backends/encode.py`).
  Logprobs are sent as null (recorded as NaN): in env mode the policy keeps its own.
- A transparent tap in front of the proxy (every other path): harness and admin requests
  are forwarded byte for byte, streams included, and the body of each harness model call
  (`/s/<sid>/v1/...`) is kept so the turn it causes can carry it. Matching is FIFO: a
  harness sends one call at a time; a call the proxy refuses (4xx/5xx, no generation) is
  dropped from the queue when its error reply passes back.

No episode attached (between episodes, after close): /generate answers 503 at once.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.gym.backends.encode import finish_reason, sglang_reply

_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


@dataclass
class HarnessCall:
    """One harness model call seen by the tap: the endpoint (without /s/<sid>) and its JSON body."""

    endpoint: str
    body: Any
    matched: bool = False


@dataclass(eq=False)
class Turn:
    """One /generate call waiting for the policy's completion."""

    prompt_ids: list[int]
    call: HarnessCall | None
    max_new_tokens: int | None
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    _future: asyncio.Future = field(repr=False)

    def answer(self, ids: list[int] | None) -> None:
        """Reply with these completion ids (thread-safe); None fails the call (the episode is closing)."""
        def settle() -> None:
            if not self._future.done():
                self._future.set_result(ids)
        self._loop.call_soon_threadsafe(settle)


class BridgeEngine:
    """The app's state: which episode's queue receives turns, and the tap's pending calls."""

    def __init__(self, stop_ids: list[int], version: Any = lambda: 0):
        self.stop_ids = set(stop_ids)
        self.version = version
        self.proxy_url = ""
        self._sink: queue.Queue | None = None
        self._calls: deque[HarnessCall] = deque()
        self._pending: set[Turn] = set()
        self._lock = threading.Lock()

    # -- episodes (called from the env's thread) ----------------------------------------
    def attach(self, sink: queue.Queue) -> None:
        with self._lock:
            self._sink = sink
            self._calls.clear()

    def detach(self) -> None:
        """No more turns for this episode; a turn still waiting is failed (the proxy answers 502)."""
        with self._lock:
            self._sink = None
            pending, self._pending = list(self._pending), set()
        for t in pending:
            t.answer(None)

    # -- the app ---------------------------------------------------------------------------
    def app(self) -> Starlette:
        methods = ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"]
        return Starlette(routes=[Route("/generate", self.generate, methods=["POST"]),
                                 Route("/health", self.health, methods=["GET"]),
                                 Route("/get_model_info", self.model_info, methods=["GET"]),
                                 Route("/abort_request", self.abort, methods=["POST"]),
                                 Route("/{path:path}", self.tap, methods=methods)])

    async def generate(self, request: Request) -> Response:
        """SGLang's /generate: the prompt becomes a turn on the episode's queue; its reply is
        the completion the env answers it with."""
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "body is not JSON"}}, 400)
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return JSONResponse({"error": {"message": "input_ids: a list of token ids is required"}}, 400)
        max_new = (body.get("sampling_params") or {}).get("max_new_tokens")
        loop = asyncio.get_running_loop()
        with self._lock:
            sink = self._sink
            if sink is None:
                return JSONResponse({"error": {"message": "no episode is running in this env"}}, 503)
            call = next((c for c in self._calls if not c.matched), None)
            if call is not None:
                call.matched = True
                self._calls.remove(call)
            turn = Turn(list(ids), call, max_new if isinstance(max_new, int) else None, loop, loop.create_future())
            self._pending.add(turn)
        sink.put(("turn", turn))
        try:
            out = await turn._future
        finally:
            with self._lock:
                self._pending.discard(turn)
        if out is None:
            return JSONResponse({"error": {"message": "the env closed this episode"}}, 503)
        finish = "stop"
        if turn.max_new_tokens is not None and len(out) > turn.max_new_tokens:
            out, finish = out[:turn.max_new_tokens], "length"
        reply = self._reply(ids, out, finish, body.get("rid") or uuid.uuid4().hex)
        if not body.get("stream"):
            return JSONResponse(reply)

        async def sse():
            yield b"data: " + json.dumps(reply).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(sse(), media_type="text/event-stream")

    async def health(self, request: Request) -> Response:
        return JSONResponse({})

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": "harnessrl-gym-env", "weight_version": str(self.version())})

    async def abort(self, request: Request) -> Response:  # nothing runs on its own here: the env answers every turn
        return JSONResponse({})

    async def tap(self, request: Request) -> Response:
        """Every other path, forwarded to the proxy byte for byte; a harness model call's body
        is kept for the turn it causes, and dropped again when the proxy refuses the call."""
        raw = await request.body()
        path = request.url.path
        call = None
        if request.method == "POST" and path.startswith("/s/"):
            try:
                call = HarnessCall("/" + path.split("/", 3)[3] if path.count("/") >= 3 else path, json.loads(raw))
            except ValueError:
                call = None  # not JSON: the proxy refuses it, no turn follows
            if call is not None:
                with self._lock:
                    self._calls.append(call)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30))
        url = self.proxy_url + path + (f"?{request.url.query}" if request.url.query else "")
        try:
            resp = await client.send(client.build_request(request.method, url, headers=headers, content=raw),
                                     stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            return JSONResponse({"error": {"message": f"env tap: proxy unreachable: {e}"}}, 502)
        if resp.status_code >= 400 and call is not None:
            with self._lock:
                if not call.matched and call in self._calls:
                    self._calls.remove(call)

        async def done() -> None:
            await resp.aclose()
            await client.aclose()
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP | {"content-encoding"}}
        if request.method == "HEAD":
            await done()
            return Response(b"", resp.status_code, headers=out_headers)
        return StreamingResponse(resp.aiter_bytes(), status_code=resp.status_code, headers=out_headers,
                                 background=BackgroundTask(done))

    def _reply(self, prompt: list[int], ids: list[int], finish: str, rid: str) -> dict:
        """The /generate body: a stop names its stop token when the completion ends with one."""
        matched = ids[-1] if finish == "stop" and ids and ids[-1] in self.stop_ids else None
        return sglang_reply(rid=rid, output_ids=ids, logprobs=[None] * len(ids),
                            finish=finish_reason(finish, matched=matched, length=len(ids)),
                            prompt_tokens=len(prompt), weight_version=str(self.version()))
