"""The engine's HTTP API: the SGLang subset of ../shared/docs/sglang-contract.md.

Routes: POST /generate (one prompt, or a batch as a list of prompts; SSE when `stream`),
/abort_request, /pause_generation, /continue_generation, /update_weights_from_disk,
/flush_cache; GET /health, /get_model_info (LoRA adapters' routes: `lora.py`). Replies have
SGLang's shapes: `meta_info` with `finish_reason` ({"type": "stop"|"length"|"abort", ...}),
`output_token_logprobs` ([[logprob, id, text|null], ...], when `return_logprob`) and
`weight_version`. Errors are
`{"error": {"message": ...}}` with 400 for bad input (the message names the field), as
SGLang's `_create_error_response` does. Streams are cumulative like SGLang's default
(every chunk holds all output so far) unless `incremental_streaming_output` is set.
SGLang bodies are rendered by `harnessrl.gym.backends.encode.sglang_reply`. vLLM's token
routes (`/inference/v1/generate`, `/v1/completions` with token ids, `/v1/models`) run on the
same scheduler (`vllm_api.py`).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from harnessrl.gym.backends.encode import sglang_reply
from harnessrl.trainers.engine.config import EngineConfig
from harnessrl.trainers.engine.lora import AdapterSlot, LoraRoutes
from harnessrl.trainers.engine.protocol import (
    AbortRequest, BadRequest, GenerateRequest, PauseRequest, UpdateWeightsRequest,
    decode_json, parse_body, split_batch, validate,
)
from harnessrl.trainers.engine.scheduler import Delta, Req, Scheduler
from harnessrl.trainers.engine.vllm_api import add_vllm_routes
from harnessrl.trainers.engine.weights import WeightLoadError, apply_weights, read_weights


@dataclass
class EngineState:
    """Everything the routes share: model facts, the scheduler, in-flight rids."""

    config: EngineConfig
    scheduler: Scheduler
    tokenizer: Any
    model_path: str
    vocab_size: int
    max_context: int
    tokenizer_path: str = ""
    in_flight: set[str] = field(default_factory=set)
    update_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    adapter: AdapterSlot = field(default_factory=AdapterSlot)
    """The LoRA adapter folded into the served weights (the LoRA routes load it; /generate's
    `lora_path` must name it)."""


class _EngineFailure(RuntimeError):
    """The engine failed a request (not an abort someone asked for)."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class _Accumulator:
    """Collects a request's deltas and renders SGLang reply bodies from them."""

    def __init__(self, state: EngineState, body: GenerateRequest, rid: str):
        self.state, self.body, self.rid = state, body, rid
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[tuple[float, int]]] = []
        self.input_logprobs: list[float | None] | None = None
        self.finish: dict | None = None
        self.version = ""
        self.text_sent = ""
        self.cached = 0

    def add(self, d: Delta) -> tuple[int, int]:
        start = len(self.ids)
        self.ids += d.ids
        self.logprobs += d.logprobs
        self.tops += d.top_logprobs
        if d.input_logprobs is not None:
            self.input_logprobs = d.input_logprobs
        self.finish, self.version = d.finish, d.weight_version
        self.cached = d.cached_tokens
        return start, len(self.ids)

    def text(self) -> str:
        p = self.body.sampling_params
        text = self.state.tokenizer.decode(self.ids, skip_special_tokens=p.skip_special_tokens)
        matched = (self.finish or {}).get("matched")
        if isinstance(matched, str) and not p.no_stop_trim and matched in text:
            text = text[: text.index(matched)]
        return text

    def _entries(self, pairs, with_text: bool) -> list:
        dec = self.state.tokenizer.decode
        return [[lp, tid, dec([tid]) if with_text and tid is not None else None] for lp, tid in pairs]

    def render(self, start: int = 0, end: int | None = None) -> dict:
        """SGLang reply body over output tokens [start:end] (whole output by default)."""
        end = len(self.ids) if end is None else end
        b = self.body
        full_text = self.text()
        if start == 0:
            text = full_text
        else:  # incremental chunk: the new part of the decoded text
            text = full_text[len(self.text_sent):] if full_text.startswith(self.text_sent) else full_text
        self.text_sent = full_text
        extra: dict[str, Any] = {}
        lps = texts = None
        if b.return_logprob:
            with_text = b.return_text_in_logprobs
            lps = self.logprobs[start:end]
            texts = [e[2] for e in self._entries(zip(lps, self.ids[start:end]), with_text)]
            if b.top_logprobs_num:
                extra["output_top_logprobs"] = [self._entries(top, with_text) for top in self.tops[start:end]]
            if b.logprob_start_len >= 0 and self.input_logprobs is not None:
                prompt = b.input_ids[b.logprob_start_len:]
                extra["input_token_logprobs"] = self._entries(zip(self.input_logprobs, prompt), with_text)
        return sglang_reply(rid=self.rid, output_ids=self.ids[start:end], logprobs=lps, finish=self.finish,
                            prompt_tokens=len(b.input_ids), weight_version=self.version, text=text,
                            completion_tokens=len(self.ids), token_texts=texts, cached_tokens=self.cached, **extra)


class _BearerAuth:
    """`Authorization: Bearer <api_key>` on every request, as plain ASGI: Starlette's
    BaseHTTPMiddleware would hide a client's disconnect from the routes, so a non-streamed
    request whose client went away would run to its end instead of being aborted."""

    def __init__(self, app, token: str):
        self.app, self.want = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and dict(scope.get("headers") or []).get(b"authorization") != self.want:
            await _error(401, "authorization: missing or wrong bearer token")(scope, receive, send)
            return
        await self.app(scope, receive, send)


class EngineApp:
    """The SGLang routes over one `EngineState`: request checks and the run of one request
    (shared with the vLLM routes), then one method per route."""

    def __init__(self, state: EngineState):
        self.state, self.sched, self.config = state, state.scheduler, state.config

    def mount(self, app: FastAPI) -> None:
        app.post("/generate")(self.generate)
        app.post("/abort_request")(self.abort_request)
        app.post("/pause_generation")(self.pause_generation)
        app.post("/continue_generation")(self.continue_generation)
        app.post("/update_weights_from_disk")(self.update_weights_from_disk)
        app.api_route("/flush_cache", methods=["GET", "POST"])(self.flush_cache)
        app.get("/health")(self.health)
        app.get("/get_model_info")(self.get_model_info)

    # -- one request: checked, submitted, run to its end or streamed ----------------------------
    def check(self, body: GenerateRequest, where: str = "") -> None:
        state = self.state
        bad = next(((i, t) for i, t in enumerate(body.input_ids) if t >= state.vocab_size), None)
        if bad is not None:
            raise BadRequest(f"{where}input_ids[{bad[0]}]: token id {bad[1]} is outside the vocabulary "
                             f"(0..{state.vocab_size - 1})")
        for name in ("stop_token_ids",):
            for t in getattr(body.sampling_params, name) or []:
                if t >= state.vocab_size:
                    raise BadRequest(f"{where}sampling_params.{name}: token id {t} is outside the vocabulary")
        if len(body.input_ids) >= state.max_context:
            raise BadRequest(f"{where}input_ids: {len(body.input_ids)} tokens do not fit the context "
                             f"length {state.max_context}")
        if body.logprob_start_len >= len(body.input_ids):
            raise BadRequest(f"{where}logprob_start_len: {body.logprob_start_len} is not inside the prompt "
                             f"of {len(body.input_ids)} tokens")
        if body.rid is not None and body.rid in state.in_flight:
            raise BadRequest(f"{where}rid: {body.rid!r} is already running")
        if body.lora_path is not None and body.lora_path != state.adapter.name:
            # SGLang refuses an adapter it has not loaded; serving the base (or another adapter)
            # under that name would stamp a policy the caller did not ask for
            loaded = repr(state.adapter.name) if state.adapter.name is not None else "none"
            raise BadRequest(f"{where}lora_path: adapter {body.lora_path!r} is not loaded (loaded: {loaded})")

    def start(self, body: GenerateRequest) -> tuple[Req, asyncio.Queue, _Accumulator]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        rid = body.rid or uuid.uuid4().hex
        p = body.sampling_params
        gen = torch.Generator().manual_seed(p.sampling_seed) if p.sampling_seed is not None else None
        req = Req(rid=rid, input_ids=list(body.input_ids), params=p,
                  sink=lambda d: loop.call_soon_threadsafe(queue.put_nowait, d),
                  stream=body.stream, top_logprobs_num=body.top_logprobs_num if body.return_logprob else 0,
                  logprob_start_len=body.logprob_start_len if body.return_logprob else -1, generator=gen,
                  priority=body.priority or 0)
        self.state.in_flight.add(rid)
        self.sched.submit(req)
        return req, queue, _Accumulator(self.state, body, rid)

    async def collect(self, body: GenerateRequest, request: Request) -> _Accumulator:
        """Run one request to its end (aborted if the client goes away); its accumulator."""
        req, queue, acc = self.start(body)
        try:
            while acc.finish is None:
                try:
                    acc.add(await asyncio.wait_for(queue.get(), timeout=1.0))
                except asyncio.TimeoutError:
                    if await request.is_disconnected():  # nobody will read it: free the batch slot
                        self.sched.abort(req.rid)
            if (acc.finish or {}).get("status_code") == 500:  # an engine failure, not a requested abort
                raise _EngineFailure(acc.finish.get("message", "engine error"))
            return acc
        finally:
            self.state.in_flight.discard(req.rid)
            if acc.finish is None:
                self.sched.abort(req.rid)

    async def deltas(self, body: GenerateRequest) -> AsyncIterator[tuple[_Accumulator, int, int]]:
        """A streamed request's deltas as (accumulator, start, end) of the new output tokens."""
        req, queue, acc = self.start(body)
        try:
            while acc.finish is None:
                start, end = acc.add(await queue.get())
                yield acc, start, end
        finally:  # also on client disconnect (the generator is closed)
            self.state.in_flight.discard(req.rid)
            if acc.finish is None:
                self.sched.abort(req.rid)

    async def stream(self, body: GenerateRequest) -> AsyncIterator[bytes]:
        incremental = self.config.incremental_streaming_output
        async with aclosing(self.deltas(body)) as deltas:
            async for acc, start, end in deltas:
                chunk = acc.render(start, end) if incremental else acc.render()
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    # -- the routes --------------------------------------------------------------------------------
    async def generate(self, request: Request):
        try:
            data = decode_json(await request.body(), GenerateRequest)
            batch = split_batch(data)
            if batch is None:
                body = validate(data, GenerateRequest)
                self.check(body)
                if body.stream:
                    return StreamingResponse(self.stream(body), media_type="text/event-stream")
                return (await self.collect(body, request)).render()
            bodies = [validate(b, GenerateRequest, prefix=f"[{i}].") for i, b in enumerate(batch)]
            for i, b in enumerate(bodies):
                self.check(b, where=f"[{i}].")
            return [acc.render() for acc in await asyncio.gather(*(self.collect(b, request) for b in bodies))]
        except BadRequest as e:
            return _error(400, str(e))
        except _EngineFailure as e:  # as SGLang: a non-streamed request that failed is a 500
            return _error(500, str(e))

    async def abort_request(self, request: Request):
        try:
            body = parse_body(await request.body(), AbortRequest)
        except BadRequest as e:
            return _error(400, str(e))
        if not body.rid and not body.abort_all:
            return _error(400, "rid: give a request id or abort_all: true")
        self.sched.abort(body.rid or None, body.abort_all)
        return JSONResponse({})

    async def pause_generation(self, request: Request):
        try:
            body = parse_body(await request.body(), PauseRequest, required=False)
        except BadRequest as e:
            return _error(400, str(e))
        n = await asyncio.wrap_future(self.sched.call(lambda s: s.pause(body.mode)))
        return JSONResponse({"message": f"Generation paused (mode {body.mode})", "num_paused_requests": n})

    async def continue_generation(self):
        await asyncio.wrap_future(self.sched.call(lambda s: s.resume()))
        return JSONResponse({"message": "Generation continued"})

    async def update_weights_from_disk(self, request: Request):
        try:
            body = parse_body(await request.body(), UpdateWeightsRequest)
        except BadRequest as e:
            return _error(400, str(e))
        sched = self.sched
        async with self.state.update_lock:
            try:  # read and check off the scheduler thread; decoding goes on meanwhile
                weights = await asyncio.to_thread(read_weights, body.model_path, sched.model, body.load_format)
            except WeightLoadError as e:
                return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0},
                                    status_code=400)

            def swap(s: Scheduler) -> int:
                n = s._abort_everything("aborted for a weight update") if body.abort_all_requests else 0
                apply_weights(s.model, weights)
                s.weights_changed()  # no KV of the old weights is served again
                if body.weight_version is not None:
                    s.weight_version = body.weight_version
                return n

            n = await asyncio.wrap_future(sched.call(swap))
            self.state.model_path = str(Path(body.model_path))
        return JSONResponse({"success": True, "num_paused_requests": n,
                             "message": f"Succeeded to update model weights (version {sched.weight_version})."})

    async def flush_cache(self):
        await asyncio.wrap_future(self.sched.call(lambda s: s.weights_changed()))  # drops the prefix cache
        return PlainTextResponse("Cache flushed.\n")

    async def health(self):
        if not self.sched.alive:
            return _error(503, "engine loop is not running")
        return PlainTextResponse("")

    async def get_model_info(self):
        # The counters are read on the stepping thread between two steps, so one reading never
        # holds half a step (busy seconds counted, slot seconds not yet) and a request whose
        # answer has already gone out has its last step counted.
        state, sched = self.state, self.sched
        counters = None
        if sched.alive:
            try:
                counters = await asyncio.wait_for(asyncio.wrap_future(sched.call(_counters)), 30)
            except asyncio.TimeoutError:
                pass
        if counters is None:  # a dead or stuck loop: the counters as they are
            counters = _counters(sched)
        return {
            "model_path": state.model_path,
            "tokenizer_path": state.tokenizer_path or state.model_path,
            "is_generation": True,
            "weight_version": sched.weight_version,
            "vocab_size": state.vocab_size,
            "max_context_length": state.max_context,
            "eos_token_ids": sorted(sched.eos_ids),
            "max_running_requests": self.config.max_running_requests,
            "logprob_space": sched.logprob_space,
            "prefix_cache": sched.prefix_cache.report(),
            "scheduler_tid": sched.native_tid,
            **counters,
            **sched.load(),
        }


def _counters(s) -> dict:
    return {"speculative": dict(s.spec_stats), "steps": s.steps, "timing": dict(s.timing),
            "decode_by_rows": {str(n): list(v) for n, v in sorted(s.decode_by_rows.items())}}


def build_app(state: EngineState) -> FastAPI:
    app = FastAPI(title="harnessrl local engine (SGLang API subset)")
    if state.config.api_key:
        app.add_middleware(_BearerAuth, token=state.config.api_key)
    engine = EngineApp(state)
    engine.mount(app)
    LoraRoutes(state).mount(app)
    add_vllm_routes(app, state, check=engine.check, collect=engine.collect, deltas=engine.deltas,
                    failure=_EngineFailure)
    return app
