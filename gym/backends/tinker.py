"""A generation backend over a Tinker `SamplingClient` (hosted Tinker, SkyRL's Tinker server).

Contract: one `generate` call is one `SamplingClient.sample(prompt=ModelInput.from_ints(ids),
num_samples=1, sampling_params=SamplingParams(...))`; its `sequences[0]` gives the sampled
token ids, their logprobs and the stop reason ("stop" | "length"). Tinker cannot stream or
abort, so `generate_stream` yields the whole output as one chunk and a reply never says
"abort".

Every new sampling client is a new policy version (Tinker's weights are published as a new
sampler: `save_weights_and_get_sampling_client`). `swap(client, version)` makes the next
calls sample from the new client; a call already in flight finishes on the client it
started with and carries that client's version, so no token is ever stamped with a
version that did not sample it.

Sampling parameters keep SGLang's names on our side and become Tinker's: max_new_tokens ->
max_tokens, stop_token_ids -> stop (token ids; none given keeps Tinker's implicit EOS stop),
top_k -1 = off in both. `priority` has no Tinker counterpart and is dropped.

The env layer must not import torch or tinker at import time: `tinker` is imported when
the first call is made.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, AsyncIterator

from harnessrl.gym.backends.engine_client import EngineTimeouts, GenerateResult
from .inprocess import CallableBackend, TokenReply
from .protocol import stream_once


def _check_version(version: Any) -> str:
    if isinstance(version, bool) or not isinstance(version, (str, int)) or str(version) == "":
        raise ValueError(f"version: {version!r} is not a policy version (a non-empty str or an int)")
    return str(version)


def _check_client(client: Any) -> Any:
    if not callable(getattr(client, "sample", None)):
        raise TypeError(f"sampling_client: {type(client).__name__} has no sample() method; "
                        "pass a tinker.SamplingClient")
    return client


async def resolve_reply(reply: Any) -> Any:
    """A Tinker call's result: an awaitable (`APIFuture` in tinker >= 0.30), a future with a
    blocking `.result()` (older SDKs; waited for in a thread), or the response itself."""
    if inspect.isawaitable(reply):
        return await reply
    if callable(getattr(reply, "result", None)):
        return await asyncio.to_thread(reply.result)
    return reply


class TinkerBackend:
    """`GenerationBackend` over a Tinker `SamplingClient`; see the module doc."""

    def __init__(self, sampling_client: Any, *, version: str | int, timeouts: EngineTimeouts | None = None,
                 logprob_space: str = "tempered", name: str = "tinker"):
        """`version`: the policy version of `sampling_client`'s weights.
        `logprob_space`: which distribution the server's logprobs are in ("tempered": the
        temperature applied, top-p/top-k not; "sampled": the filtered distribution)."""
        self._lock = threading.Lock()
        self._client, self._version = _check_client(sampling_client), _check_version(version)
        self._inner = CallableBackend(self._sample, name=name, timeouts=timeouts, logprob_space=logprob_space,
                                      info={"engine": "tinker"})
        self.base_url = self._inner.base_url
        self.timeouts = self._inner.timeouts
        self.swaps = 0

    @property
    def version(self) -> str:
        """The version the next call will sample with."""
        return self._version

    @property
    def client(self) -> Any:
        return self._client

    def swap(self, sampling_client: Any, version: str | int) -> None:
        """Sample from `sampling_client` (weights of `version`) from the next call on; calls in
        flight finish on the old client with the old version. Safe from any thread."""
        client, v = _check_client(sampling_client), _check_version(version)
        with self._lock:
            self._client, self._version = client, v
            self.swaps += 1

    def _current(self) -> tuple[Any, str]:
        with self._lock:
            return self._client, self._version

    async def _sample(self, input_ids: list[int], params: dict[str, Any], rid: str) -> TokenReply:
        from tinker import types

        client, version = self._current()  # one snapshot: the client and the version that goes with it
        stop = params.get("stop_token_ids")
        sp = types.SamplingParams(max_tokens=int(params["max_new_tokens"]), temperature=float(params.get("temperature", 1.0)),
                                  top_p=float(params.get("top_p", 1.0)), top_k=int(params.get("top_k", -1)),
                                  stop=[int(t) for t in stop] if stop else None, seed=params.get("seed"))
        reply = client.sample(prompt=types.ModelInput.from_ints([int(t) for t in input_ids]), num_samples=1,
                              sampling_params=sp)
        try:
            response = await resolve_reply(reply)
        except asyncio.CancelledError:
            fut = getattr(reply, "future", None)
            if callable(fut):  # the proxy gave up on the call: drop it on the SDK's side too
                fut().cancel()
            raise
        seqs = list(getattr(response, "sequences", None) or [])
        if not seqs:
            raise ValueError(f"Tinker answered request {rid} with no sequence")
        seq = seqs[0]
        lps = seq.logprobs
        return TokenReply(token_ids=[int(t) for t in seq.tokens], logprobs=None if lps is None else [float(x) for x in lps],
                          finish_reason=str(seq.stop_reason), weight_version=version)

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                       rid: str | None = None, seed: int | None = None,
                       priority: int | None = None) -> GenerateResult:
        return await self._inner.generate(input_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                          top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids, rid=rid,
                                          seed=seed, priority=None)

    def generate_stream(self, input_ids: list[int], **kw: Any) -> AsyncIterator[GenerateResult]:
        return stream_once(self, input_ids, **kw)

    async def health(self) -> bool:
        return True

    async def model_info(self) -> dict[str, Any]:
        return await self._inner.model_info() | {"weight_version": self.version}

    async def aclose(self) -> None:
        return None


__all__ = ["TinkerBackend"]
