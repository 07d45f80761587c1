"""Many engines behind one proxy: each session sticks to one engine, a failed engine is routed around.

Contract: `RoutedBackend(backends)` is a `GenerationBackend` over several URL backends (one per
engine, all of one kind). A session's first generation picks the engine in service with the
fewest live sessions (ties: the lowest index); every later generation of that session (read
from `SESSION`, set by the proxy before each call) goes to the same engine, so its growing
conversation hits that engine's prefix cache. Least-sessions rather than a consistent hash:
the proxy sees every session open and close, so it can keep the table a hash only
approximates, and episodes are few, long and uneven (a hash balances only on average: with
12 sessions on 3 engines one engine holds at least twice another's share 62% of the time).
A closed session leaves the table (`release`, called by the proxy).

An engine fails when a generation or /health on it is unreachable, breaks mid-reply or answers
a 5xx (`engine_failed`); a timeout counts only if /health then fails too (a long reply is
not a failure). A failed engine is taken out of service with the reason: the error still
reaches the proxy, which records that call `engine_error`, so the episode in flight there
ends masked (`gym.episode`); its sessions' next calls, and every new session, go to the
engines still in service. With none left, a call fails at once (an `EngineError` naming them).

An engine comes back through `serve_only(urls)`: a weight sync that reached it
(`trainers.weight_sync.paused` tells the proxy, `ProxyServer.use_engines`) also proves it holds
the current weights; a revived engine that was not synced may serve old ones. The one other
way back is the last resort: with no engine in service, a call first probes them all and
takes back those that answer /health (a proxy with no trainer behind it would otherwise never
use a restarted engine again; the tokens still carry the version that sampled them). A backend reply
names no engine, so `engine_of(session)` says which one serves a session (the proxy records it
in each call's `flags["engine"]`).

SGLang's own router (`sglang_router`, cache-aware) is the alternative: give the proxy its one
URL as the engine and leave this class out (docs/scaling.md, "Many engines").
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout, GenerateResult
from harnessrl.gym.backends.protocol import SESSION, GenerationBackend

PROBE_S = 5.0
"""Bound on the /health probe after a timed-out generation (a stopped engine never answers)."""


def engine_failed(e: BaseException) -> bool:
    """Is `e` the engine's failure (unreachable, a broken or unreadable reply, a 5xx), as
    opposed to a refusal of this request (a 4xx: the prompt outgrew the context)? A timeout
    is neither: the caller probes /health to tell."""
    if isinstance(e, EngineTimeout) or not isinstance(e, EngineError):
        return False
    return e.status_code is None or e.status_code >= 500


@dataclass
class EngineSlot:
    """One engine of the router and what the router knows of it."""

    url: str
    backend: Any
    in_service: bool = True
    reason: str = ""
    """Why it is out of service (the error that took it out)."""
    sessions: int = 0
    """Live sessions routed to it."""
    calls: int = 0
    """Generations sent to it."""


class RoutedBackend:
    """Sticky per-session routing over several engines (module doc)."""

    def __init__(self, backends: Sequence[GenerationBackend]):
        if not backends:
            raise ValueError("RoutedBackend needs at least one engine")
        self.slots = [EngineSlot(b.base_url.rstrip("/"), b) for b in backends]
        urls = [s.url for s in self.slots]
        if len(set(urls)) != len(urls):
            raise ValueError(f"engine URLs must differ: {urls}")
        self.base_url = ", ".join(urls)
        self.timeouts = backends[0].timeouts
        self._table: dict[str, EngineSlot] = {}
        self._lock = threading.Lock()  # the table is read on the proxy loop, released from admin threads

    # ---- routing ------------------------------------------------------------------------
    def _slot(self, session: str | None) -> EngineSlot:
        with self._lock:
            slot = self._table.get(session) if session is not None else None
            if slot is not None and not slot.in_service:  # its engine failed: the session moves
                slot.sessions -= 1
                del self._table[session]
                slot = None
            if slot is None:
                live = [s for s in self.slots if s.in_service]
                if not live:
                    raise EngineError("no engine in service: " + "; ".join(f"{s.url}: {s.reason}" for s in self.slots))
                slot = min(live, key=lambda s: s.sessions)  # min keeps the first of equals: lowest index
                if session is not None:
                    self._table[session] = slot
                    slot.sessions += 1
            slot.calls += 1
            return slot

    def engine_of(self, session: str) -> str | None:
        """The URL of the engine that serves `session` now (None: not routed yet, or moved off a failed one)."""
        with self._lock:
            slot = self._table.get(session)
            return slot.url if slot is not None else None

    def release(self, session: str) -> None:
        """`session` is closed: it no longer counts toward its engine's load."""
        with self._lock:
            slot = self._table.pop(session, None)
            if slot is not None:
                slot.sessions -= 1

    def take_out(self, url: str, reason: str) -> None:
        """Engine `url` out of service (`reason` kept); its sessions move on their next call."""
        for s in self.slots:
            if s.url == url.rstrip("/") and s.in_service:
                s.in_service, s.reason = False, reason

    def serve_only(self, urls: Sequence[str]) -> None:
        """Exactly these engines in service (a weight sync reached them); any other is taken out."""
        keep = {u.rstrip("/") for u in urls}
        unknown = keep - {s.url for s in self.slots}
        if unknown:
            raise ValueError(f"serve_only: {sorted(unknown)} are not engines of this router: {self.base_url}")
        for s in self.slots:
            if s.url in keep:
                s.in_service, s.reason = True, ""
            elif s.in_service:
                s.in_service, s.reason = False, "behind: the last weight sync did not reach it"

    def report(self) -> list[dict[str, Any]]:
        """Each engine: url, in_service, reason, live sessions, generations sent."""
        return [{"url": s.url, "in_service": s.in_service, "reason": s.reason, "sessions": s.sessions,
                 "calls": s.calls} for s in self.slots]

    async def _failed(self, slot: EngineSlot, e: EngineError) -> None:
        if engine_failed(e):
            self.take_out(slot.url, str(e))
        elif isinstance(e, EngineTimeout) and not await self._alive(slot):
            self.take_out(slot.url, f"{e}; /health did not answer after it")

    async def _alive(self, slot: EngineSlot) -> bool:
        try:
            return await asyncio.wait_for(slot.backend.health(), PROBE_S)
        except (asyncio.TimeoutError, EngineError):
            return False

    async def _last_resort(self) -> None:
        """With no engine in service, every engine that answers /health again is taken back
        (better its weights than no reply at all)."""
        if not any(s.in_service for s in self.slots):
            alive = await asyncio.gather(*(self._alive(s) for s in self.slots))
            for s, ok in zip(self.slots, alive):
                if ok:
                    s.in_service, s.reason = True, ""

    async def _route(self) -> EngineSlot:
        await self._last_resort()
        return self._slot(SESSION.get())

    # ---- the GenerationBackend contract ---------------------------------------------------
    async def generate(self, input_ids: list[int], **kw: Any) -> GenerateResult:
        slot = await self._route()
        try:
            return await slot.backend.generate(input_ids, **kw)
        except EngineError as e:
            await self._failed(slot, e)
            raise

    async def generate_stream(self, input_ids: list[int], **kw: Any) -> AsyncIterator[GenerateResult]:
        slot = await self._route()
        try:
            async for chunk in slot.backend.generate_stream(input_ids, **kw):
                yield chunk
        except EngineError as e:
            await self._failed(slot, e)
            raise

    async def health(self) -> bool:
        """The calling session's engine answers /health (a failed one is taken out and the
        session moves, so then: does any engine in service answer)."""
        session = SESSION.get()
        with self._lock:
            slot = self._table.get(session) if session is not None else None
        if slot is not None and slot.in_service:
            if await self._alive(slot):
                return True
            self.take_out(slot.url, "/health did not answer")
        for s in [s for s in self.slots if s.in_service]:
            if await self._alive(s):
                return True
        return False

    async def model_info(self) -> dict[str, Any]:
        """The first engine in service that answers (every engine serves the same model); one
        that fails is taken out of service on the way."""
        error: EngineError | None = None
        await self._last_resort()
        for slot in [s for s in self.slots if s.in_service]:
            try:
                return await slot.backend.model_info()
            except EngineError as e:
                await self._failed(slot, e)
                error = e
        raise error or EngineError("no engine in service: " + "; ".join(f"{s.url}: {s.reason}" for s in self.slots))

    def use_lora(self, name: str | None) -> None:
        """Every engine's generations name adapter `name` from now on (None: base weights)."""
        for s in self.slots:
            select = getattr(s.backend, "use_lora", None)
            if select is not None:
                select(name)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.backend.aclose() for s in self.slots), return_exceptions=True)
