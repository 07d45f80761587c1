"""The contract every generation backend meets (structural: implementations do not inherit).

One `generate` call is one engine request: prompt token ids in; sampled token ids, their
logprobs (NaN where a backend has none), a finish reason ("stop" | "length" | "abort") and
the weight version that sampled them out. `generate_stream` yields the same as chunks of
*new* tokens, the last one finished. "abort" carries the partial output; the caller
(`gym/proxy/generation.py`) resumes with prompt + output so far and a smaller budget, so a
backend never resumes on its own. Sampling parameters are SGLang's names (temperature,
top_p, top_k with -1 = off, stop_token_ids, seed, priority); a backend translates them.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Any, AsyncIterator, Protocol, runtime_checkable

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout, EngineTimeouts, GenerateResult

FINISH_REASONS = ("stop", "length", "abort")

SESSION: ContextVar[str | None] = ContextVar("harnessrl_proxy_session", default=None)
"""The proxy session (one episode) whose call is generating now, set by the proxy before
each call reaches its backend. A backend that routes an episode's calls together reads it
(SkyRL's `session_ids`, verl's request id); it reaches a callable on another loop too
(`run_coroutine_threadsafe` copies the calling context)."""


@runtime_checkable
class GenerationBackend(Protocol):
    base_url: str
    """Where it generates, for messages (a URL, or a description such as `inprocess:verl`)."""
    timeouts: EngineTimeouts
    """Bounds on one generation; `total_s` also bounds waiting for a backend that aborted."""

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                       rid: str | None = None, seed: int | None = None,
                       priority: int | None = None) -> GenerateResult: ...

    def generate_stream(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                        top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                        rid: str | None = None, seed: int | None = None,
                        priority: int | None = None) -> AsyncIterator[GenerateResult]: ...

    async def health(self) -> bool: ...

    async def model_info(self) -> dict[str, Any]:
        """Facts about the model; `logprob_space` ("sampled" | "tempered") when the backend knows
        which distribution its logprobs belong to."""
        ...

    async def aclose(self) -> None: ...


async def stream_once(backend: Any, input_ids: list[int], **kw: Any) -> AsyncIterator[GenerateResult]:
    """`generate_stream` for a backend that cannot stream: one chunk holding the whole output."""
    yield await backend.generate(input_ids, **kw)


def normalize_finish(reason: Any, n_out: int, max_new_tokens: int) -> str:
    """Map a backend's stop reason onto ours: verl's "completed"/"aborted", vLLM's and
    OpenAI's "stop"/"length"/"abort", Tinker's "stop"/"length"; None when it is unknown
    means length if the budget ran out, else stop."""
    r = str(reason or "").lower()
    if r in ("abort", "aborted", "cancelled", "preempted"):
        return "abort"
    if r in ("length", "max_tokens", "max_length"):
        return "length"
    if r in ("stop", "completed", "eos", "stop_sequence", "end_turn"):
        return "stop"
    return "length" if n_out >= max_new_tokens else "stop"


__all__ = ["FINISH_REASONS", "SESSION", "EngineError", "EngineTimeout", "EngineTimeouts", "GenerateResult",
           "GenerationBackend", "normalize_finish", "stream_once"]
