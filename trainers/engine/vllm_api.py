"""vLLM's token routes on the local engine's scheduler, so `VllmBackend` meets a real engine.

Routes: POST /inference/v1/generate (vLLM's tokens-in/tokens-out route), POST /v1/completions
(one token-id `prompt`; a text prompt is a 400 naming `prompt`), GET /v1/models. Requests are
validated by `protocol.VllmGenerateRequest` / `VllmCompletionRequest`; a bad one is a 400
`{"error": {"message": "<field>: ...", "param": "<field>", ...}}` (vLLM's ErrorResponse).
Each is translated to the engine's own request (SGLang's names) and runs on the same
scheduler as /generate, so the same prompt and sampling give the same ids and logprobs on
every route. Replies have vLLM's shapes (`harnessrl.gym.backends.vllm_wire`) plus a
top-level `weight_version`, which vLLM itself does not send.

As in vLLM: a client that closes its connection aborts its request; a request aborted by
pause (mode abort) or /abort_request finishes "abort" with its partial output; a streamed
generate sends no chunk without new tokens (so an abort between tokens ends the stream with
`[DONE]` alone); an engine failure is a 500 (streamed: an error chunk). Unlike vLLM, the
`priority` (lower first, vLLM's direction) is always honoured, and prompt + max_tokens past
the context is not refused (generation stops at the context).
"""
from __future__ import annotations

import json
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from harnessrl.gym.backends.vllm_wire import (
    completion_logprobs, completion_reply, error_body, generate_logprobs, generate_reply,
)
from harnessrl.trainers.engine.protocol import (
    BadRequest, GenerateRequest, VllmCompletionRequest, VllmGenerateRequest, parse_body,
)

#: How the engine's request checks name fields, per route (engine name -> vLLM name).
_GENERATE_NAMES = (("input_ids", "token_ids"), ("rid", "request_id"))
_COMPLETION_NAMES = (("input_ids", "prompt"), ("rid", "request_id"), ("sampling_params.", ""))


def _bad(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message, message.split(":", 1)[0]), status_code=status)


def _sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _reason(finish: dict | None) -> str | None:
    return None if finish is None else str(finish.get("type"))


def _stop_reason(finish: dict | None) -> int | str | None:
    return (finish or {}).get("matched") if _reason(finish) == "stop" else None


def add_vllm_routes(app: FastAPI, state: Any, *, check: Callable, collect: Callable, deltas: Callable,
                    failure: type[Exception]) -> None:
    """Serve the routes on `app`. `check(body)` raises BadRequest in the engine's field names,
    `collect(body, request)` runs a request to its end (raising `failure` on an engine error),
    `deltas(body)` streams (accumulator, start, end) (server.py's handlers)."""
    VllmRoutes(state, check, collect, deltas, failure).mount(app)


class VllmRoutes:
    """vLLM's routes over the engine's state and its request runner (`add_vllm_routes`)."""

    def __init__(self, state: Any, check: Callable, collect: Callable, deltas: Callable, failure: type[Exception]):
        self.state, self.check, self.collect, self.deltas, self.failure = state, check, collect, deltas, failure
        self.served = Path(state.model_path).name  # the name at start-up, kept across weight updates
        self.dec = state.tokenizer.decode

    def mount(self, app: FastAPI) -> None:
        app.post("/inference/v1/generate")(self.vllm_generate)
        app.post("/v1/completions")(self.vllm_completions)
        app.get("/v1/models")(self.vllm_models)

    def engine_request(self, ids: list[int], sp: Any, rid: str | None, stream: bool, priority: int,
                       names: tuple) -> GenerateRequest:
        body = GenerateRequest(input_ids=ids, sampling_params=sp.engine_params(max(1, self.state.max_context - len(ids))),
                               rid=rid, stream=stream, return_logprob=True,
                               top_logprobs_num=sp.logprobs or 0, priority=-priority)
        try:
            self.check(body)
        except BadRequest as e:
            msg = str(e)
            for old, new in names:
                if msg.startswith(old):
                    msg = new + msg[len(old):]
                    break
            raise BadRequest(msg) from None
        return body

    async def run(self, body: GenerateRequest, request: Request):
        try:
            return await self.collect(body, request), None
        except self.failure as e:
            return None, _bad(500, f"engine error: {e}")

    async def vllm_generate(self, request: Request):
        try:
            v = parse_body(await request.body(), VllmGenerateRequest)
            body = self.engine_request(v.token_ids, v.sampling_params, v.request_id, v.stream, v.priority,
                                       _GENERATE_NAMES)
        except BadRequest as e:
            return _bad(400, str(e))
        num, model = v.sampling_params.logprobs, v.model or self.served

        def reply(acc, start: int, end: int, stream: bool) -> dict:
            ids = acc.ids[start:end]
            lps = None if num is None else generate_logprobs(ids, acc.logprobs[start:end], acc.tops[start:end], num)
            return generate_reply(request_id=acc.rid, model=model, token_ids=ids, logprobs=lps,
                                  finish_reason=_reason(acc.finish), prompt_tokens=len(v.token_ids),
                                  completion_tokens=len(acc.ids), weight_version=acc.version, stream=stream)

        if v.stream:
            async def chunks() -> AsyncIterator[bytes]:
                async with aclosing(self.deltas(body)) as ds:
                    async for acc, start, end in ds:
                        if (acc.finish or {}).get("status_code") == 500:
                            yield _sse(error_body(500, f"engine error: {acc.finish.get('message')}"))
                            break
                        if end > start:  # vLLM sends no chunk without new tokens
                            yield _sse(reply(acc, start, end, True))
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        acc, err = await self.run(body, request)
        return err or reply(acc, 0, len(acc.ids), False)

    async def vllm_completions(self, request: Request):
        try:
            v = parse_body(await request.body(), VllmCompletionRequest)
            body = self.engine_request(v.prompt, v, v.request_id, v.stream, v.priority, _COMPLETION_NAMES)
        except BadRequest as e:
            return _bad(400, str(e))
        dec = self.dec
        num, model, with_ids = v.logprobs, v.model or self.served, v.return_token_ids
        name = (lambda t: f"token_id:{t}") if v.return_tokens_as_token_ids else (lambda t: dec([t]))

        def reply(acc, start: int, end: int, text: str, offset0: int, stream: bool) -> dict:
            ids = acc.ids[start:end]
            lps = None if num is None else completion_logprobs(
                ids, acc.logprobs[start:end], [dec([t]) for t in ids], acc.tops[start:end], num, offset0, name)
            return completion_reply(request_id=acc.rid, model=model, text=text, token_ids=ids if with_ids else None,
                                    prompt_token_ids=v.prompt if with_ids and start == 0 else None, logprobs=lps,
                                    finish_reason=_reason(acc.finish), stop_reason=_stop_reason(acc.finish),
                                    prompt_tokens=len(v.prompt), completion_tokens=len(acc.ids),
                                    weight_version=acc.version, stream=stream)

        if v.stream:
            async def chunks() -> AsyncIterator[bytes]:
                sent = ""
                async with aclosing(self.deltas(body)) as ds:
                    async for acc, start, end in ds:
                        if (acc.finish or {}).get("status_code") == 500:
                            yield _sse(error_body(500, f"engine error: {acc.finish.get('message')}"))
                            break
                        full = acc.text()
                        delta = full[len(sent):] if full.startswith(sent) else full
                        if end > start or acc.finish is not None:  # the finishing chunk even without new ids
                            yield _sse(reply(acc, start, end, delta, len(sent), True))
                        sent = full
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        acc, err = await self.run(body, request)
        return err or reply(acc, 0, len(acc.ids), acc.text(), 0, False)

    async def vllm_models(self):
        state = self.state
        card = {"id": self.served, "object": "model", "created": int(time.time()), "owned_by": "harnessrl",
                "root": state.model_path, "parent": None, "max_model_len": state.max_context,
                "logprob_space": state.scheduler.logprob_space}
        return {"object": "list", "data": [card]}
