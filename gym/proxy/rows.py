"""One call's row in the store, whatever became of the call.

A delivered call's row extends its segment. A *detached* row (`flags["detached"]`) is in
the record but in no segment (`gym.trajectory`): a failed engine call (finish_reason
"engine_error", no completion tokens, `flags["engine_error"]` with the message, its kind,
and for a timeout the phase and whether /health answered right after), or a reply the
harness never received (`flags["undelivered"]`, with whatever was generated), a prompt the
engine refused with a 400 (`flags["refused"]`: its message, `prompt_tokens`), or a call
the proxy itself failed (`flags["proxy_error"]`: not an engine failure). With several engines
every row names the one that served (or failed) it (`flags["engine"]`). Every row
stores its prompt as a delta against its segment (`prefix_len` + the new ids).
"""
from __future__ import annotations

from typing import Any

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout
from .canonical import ChatRequest
from .dialects import recorded_name
from .errors import ProxyError
from .generation import Generation, VersionMap
from .recorder import Plan, Session
from .store import Store


class CallRow:
    """Writes one call's row (the prompt as a delta against its segment)."""

    def __init__(self, store: Store, versions: VersionMap, counters: dict[str, int], s: Session, pl: Plan,
                 req: ChatRequest, cid: str, gen: Generation, queue_s: float, env_s: float | None):
        self.store, self.versions, self.counters = store, versions, counters
        self.s, self.pl, self.req, self.cid, self.gen = s, pl, req, cid, gen
        self.queue_s, self.env_s = queue_s, env_s

    def add(self, flags: dict[str, Any], finish_reason: str | None = None, completion: bool = True) -> list[int]:
        s, pl, gen = self.s, self.pl, self.gen
        versions = [self.versions(v) for v in gen.versions] if completion else []
        self.store.add_call(
            call_id=self.cid, session_id=s.id, idx=s.records, dialect=recorded_name(self.req.dialect), segment=pl.segment,
            split_reason=pl.split_reason, prefix_len=pl.prefix_len, new_prompt=pl.prompt_ids[pl.prefix_len:],
            completion=gen.ids if completion else [], logprobs=gen.logprobs if completion else [],
            versions=versions, finish_reason=finish_reason or gen.finish_reason, queue_s=self.queue_s,
            gen_s=gen.gen_s, env_s=self.env_s, flags=flags)
        s.records += 1
        return versions

    def detached(self, why: str, params: dict[str, Any] | None, flags: dict[str, Any] | None = None,
                 finish_reason: str | None = None, completion: bool = True, **extra: Any) -> None:
        """A row that extends no segment (see `gym.trajectory`)."""
        flags = dict(flags or {}, detached=why, **extra)
        if self.pl.split_reason is not None:
            flags.setdefault("split_reason", self.pl.split_reason)
        if self.gen.interruptions:
            flags.setdefault("interruptions", self.gen.interruptions)
        if params is not None:
            flags.setdefault("max_new_tokens", params.get("max_new_tokens"))
        self.add(flags, finish_reason or self.gen.finish_reason or "abort", completion)
        if why in ("undelivered", "engine_error"):
            self.counters["undelivered" if why == "undelivered" else "engine_errors"] += 1

    def failed(self, e: EngineError, params: dict[str, Any] | None, healthy: bool | None = None,
               engine: str | None = None) -> ProxyError:
        """Record a failed engine call (not a refused prompt); the error the harness gets for it.
        `engine`: which of several engines failed it (`flags["engine"]`)."""
        if e.status_code == 400:
            # e.g. the prompt outgrew the context: the harness must compact. Not an engine
            # failure (the policy's own doing, so never a mask) and nothing was generated: a
            # detached "refused" row keeps the engine's message and the prompt's length, so an
            # episode that ends here says why (gym.episode.ContextExceeded).
            self.detached("refused", params, finish_reason="refused", completion=False, refused=str(e),
                          prompt_tokens=len(self.pl.prompt_ids))
            return ProxyError(400, f"the engine refused the prompt: {e}", param="messages")
        timeout = isinstance(e, EngineTimeout)
        extra: dict[str, Any] = {"engine_error": str(e), "engine_error_kind": "timeout" if timeout else "unavailable"}
        if timeout:
            extra["engine_timeout_phase"] = e.phase
            extra["engine_healthy"] = healthy
        if engine is not None:
            extra["engine"] = engine
        if self.gen.ids:  # a stream that broke: what arrived is not a reply, keep only the count
            extra["partial_tokens"] = len(self.gen.ids)
        self.detached("engine_error", params, finish_reason="engine_error", completion=False, **extra)
        return ProxyError(504 if timeout else 503, f"generation failed: {e}", kind="api_error")
