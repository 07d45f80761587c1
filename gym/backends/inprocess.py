"""A generation backend that is an async callable in this process.

This is what a distributed trainer's own generation side offers an agent loop: verl's
`server_manager.generate`, SkyRL's inference engine client. The proxy (which runs on its
own event loop, in its own thread) calls it as a backend; when the callable belongs to
another loop (the trainer's), each call is run there with `run_coroutine_threadsafe` and
cancelling the proxy's call cancels it there (the trainer's client aborts the request).

The callable: `async fn(input_ids, params, rid) -> TokenReply`, where `params` holds the
contract's sampling fields (max_new_tokens, temperature, top_p, top_k, stop_token_ids,
seed, priority; None values dropped). A bridge translates them to its trainer's names and
the trainer's reply into a `TokenReply`.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeouts, GenerateResult, bounded
from .protocol import normalize_finish, stream_once


@dataclass
class TokenReply:
    """What a trainer's generation side returned for one request."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    """Any spelling `normalize_finish` knows ("completed", "aborted", "length", ...)."""
    weight_version: str | int | None = None
    """The version of the weights that sampled these tokens (oldest, when they span several)."""
    versions: list[str] | None = None
    """Per-token versions, when the trainer knows them (a resumed partial rollout)."""
    extra: dict[str, Any] = field(default_factory=dict)


Generate = Callable[[list[int], dict[str, Any], str], Awaitable[TokenReply]]


class CallableBackend:
    """`GenerationBackend` over an async callable; see the module doc."""

    def __init__(self, fn: Generate, *, name: str = "callable", loop: asyncio.AbstractEventLoop | None = None,
                 timeouts: EngineTimeouts | None = None, version: Callable[[], str | int] | None = None,
                 logprob_space: str = "tempered", info: dict[str, Any] | None = None):
        """`loop`: the loop the callable must run on (None: whichever loop calls it).
        `version`: the current weight version, used when a reply carries none.
        `logprob_space`: which distribution its logprobs are in ("tempered": temperature
        applied, top-p/top-k not, as vLLM and SGLang report them; "sampled")."""
        self.fn, self.loop, self._version = fn, loop, version
        self.base_url = f"inprocess:{name}"
        self.timeouts = timeouts or EngineTimeouts(connect_s=None, first_byte_s=None, idle_s=None)
        self._info = dict(info or {}, logprob_space=logprob_space, backend=self.base_url)
        self.calls = 0

    async def _call(self, input_ids: list[int], params: dict[str, Any], rid: str) -> TokenReply:
        coro = self.fn(list(input_ids), params, rid)
        if self.loop is None:
            return await coro
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always called from a coroutine
            here = None
        if here is self.loop:
            return await coro
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return await asyncio.wrap_future(fut)
        finally:
            if not fut.done():
                fut.cancel()  # the proxy's call was cancelled: cancel the trainer's request too

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                       rid: str | None = None, seed: int | None = None,
                       priority: int | None = None) -> GenerateResult:
        params = {k: v for k, v in dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                        top_k=top_k, stop_token_ids=stop_token_ids, seed=seed,
                                        priority=priority).items() if v is not None}
        self.calls += 1
        try:
            reply = await bounded(self._call(input_ids, params, rid or f"call-{self.calls}"),
                                   self.timeouts.total_s, "total", self.base_url)
        except EngineError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the trainer's generation side failed: the call fails, recorded
            raise EngineError(f"{self.base_url} generation failed: {type(e).__name__}: {e}") from e
        return self.result(reply, len(input_ids), max_new_tokens)

    def result(self, reply: TokenReply, prompt_tokens: int, max_new_tokens: int) -> GenerateResult:
        ids = [int(t) for t in reply.token_ids]
        lps = reply.logprobs
        if lps is None or len(lps) != len(ids):
            lps = [math.nan] * len(ids)
        version = reply.weight_version
        if version is None and self._version is not None:
            version = self._version()
        res = GenerateResult(ids, [float(x) for x in lps], normalize_finish(reply.finish_reason, len(ids), max_new_tokens),
                             "" if version is None else str(version), prompt_tokens)
        if reply.versions is not None and len(reply.versions) == len(ids):
            res.versions = [str(v) for v in reply.versions]
        return res

    def generate_stream(self, input_ids: list[int], **kw: Any) -> AsyncIterator[GenerateResult]:
        return stream_once(self, input_ids, **kw)

    async def health(self) -> bool:
        return True

    async def model_info(self) -> dict[str, Any]:
        return dict(self._info)

    async def aclose(self) -> None:
        return None
