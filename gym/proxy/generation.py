"""Generation through the engine contract, interruptible and pausable.

Contract: token ids in, token ids + logprobs out, only via a `GenerationBackend`
(`gym/backends`; never an engine's OpenAI endpoint). When the engine answers `finish_reason == "abort"` (a weight
update paused it), the call waits until generation is resumed, then re-sends
`/generate` with `input_ids + partial output` and the remaining token budget, and
concatenates; each token keeps the version of the weights that sampled it. The harness
only sees a slower response. Each engine request runs under the client's
`EngineTimeouts`; an engine that aborted on its own and stays unhealthy longer than
their `total_s` fails the call (an `EngineError`) instead of holding it.

`PauseGate` is the proxy-level pause: new calls wait for `resume()` (the app turns a too
long wait into a 429 with Retry-After); interrupted calls wait without that limit.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..backends.protocol import GenerationBackend
from harnessrl.gym.backends.engine_client import EngineError


class PauseGate:
    """An asyncio event owned by the proxy loop; `pause`/`resume` are loop-thread calls."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.paused_at: float | None = None

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    def pause(self) -> None:
        if not self.paused:
            self.paused_at = time.monotonic()
        self._open.clear()

    def resume(self) -> None:
        self.paused_at = None
        self._open.set()

    async def wait(self, timeout: float | None = None) -> bool:
        """True once open; False when `timeout` passed first."""
        if self._open.is_set():
            return True
        try:
            await asyncio.wait_for(self._open.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False


class VersionMap:
    """Engine weight versions are strings; records hold ints. Numeric strings keep their
    value; others (SGLang's "default") are numbered in first-seen order from 0."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def __call__(self, v: str) -> int:
        n = self._ids.get(v)
        if n is None:
            try:
                n = int(v)
            except ValueError:
                n = len([k for k in self._ids if not k.lstrip("-").isdigit()])
            self._ids[v] = n
        return n


@dataclass
class Generation:
    """One call's generation; `ids`/`logprobs`/`versions` grow as chunks arrive."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    finish_reason: str = ""
    interruptions: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine served from its prefix cache, over all requests of the call."""
    gen_s: float = 0.0
    wait_s: float = 0.0


async def generate(engine: GenerationBackend, gate: PauseGate, prompt: list[int], *, stream: bool,
                   max_interruptions: int, params: dict[str, Any], rid: str,
                   out: Generation) -> AsyncIterator[list[int]]:
    """Run one call to completion, yielding each batch of new ids (streamed or not)."""
    budget = params["max_new_tokens"]
    backoff = 0.05
    while True:
        t0 = time.perf_counter()
        n0 = len(out.ids)
        if stream:
            async for chunk in engine.generate_stream(prompt + out.ids if out.ids else prompt, rid=rid,
                                                      **dict(params, max_new_tokens=budget)):
                _add(out, chunk.output_ids, chunk.logprobs, chunk.weight_version, chunk.versions)
                if chunk.finish_reason:
                    out.cached_tokens += chunk.cached_tokens
                    out.finish_reason = chunk.finish_reason
                if chunk.output_ids:
                    yield chunk.output_ids
        else:
            res = await engine.generate(prompt + out.ids if out.ids else prompt, rid=rid,
                                        **dict(params, max_new_tokens=budget))
            _add(out, res.output_ids, res.logprobs, res.weight_version, res.versions)
            out.finish_reason = res.finish_reason
            out.cached_tokens += res.cached_tokens
            if res.output_ids:
                yield res.output_ids
        out.gen_s += time.perf_counter() - t0
        if out.finish_reason != "abort":
            return
        out.interruptions += 1
        budget -= len(out.ids) - n0
        if budget <= 0:
            out.finish_reason = "length"
            return
        if out.interruptions > max_interruptions:
            raise EngineError(f"generation aborted {out.interruptions} times (max_interruptions); giving up")
        t1 = time.perf_counter()
        if gate.paused:
            await gate.wait()  # the trainer paused us for a weight update: resume when it says so
        else:
            await asyncio.sleep(backoff)  # the engine aborted on its own: give it a moment
            backoff = min(backoff * 2, 1.0)
            limit = engine.timeouts.total_s  # a dead engine must fail the call, not hold it
            while not await engine.health():
                if limit is not None and time.perf_counter() - t1 > limit:
                    raise EngineError(f"the engine aborted the generation and did not answer /health "
                                      f"within {limit:g} s (EngineTimeouts.total_s)")
                await asyncio.sleep(backoff)
        out.wait_s += time.perf_counter() - t1


def _add(out: Generation, ids: list[int], lps: list[float], version: str, versions: list[str] | None = None) -> None:
    out.ids += ids
    out.logprobs += lps if len(lps) == len(ids) else [float("nan")] * len(ids)
    out.versions += versions if versions is not None and len(versions) == len(ids) else [version] * len(ids)
