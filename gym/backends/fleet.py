"""The control side of many engines: pause, weight loads and LoRA loads fanned out to all of them.

Contract: `EngineFleet(urls)` answers the control calls of `EngineClient` that a weight sync
makes (`pause`, `resume`, `update_weights_from_disk`, `load_lora_adapter`,
`unload_lora_adapter`, `update_weight_version`, `flush_cache`, `abort`), so
`trainers.weight_sync.DiskWeightSync` and `trainers.lora_sync.AdapterWeightSync` drive three
engines as they drive one. Each call goes to every target engine at once:
- pause, resume, flush, abort and version stamps go to the engines in service; a weight or
  adapter load (and the unload before it) goes to every engine, so one that was out of service
  and answers again gets the current weights and comes back;
- an engine that fails a call (unreachable, 5xx, any refusal of a load) is taken out of
  service with the reason and left at the version it last loaded: the others go on. A call
  raises only when no target engine succeeded;
- none blocks the others: once one engine has answered, the rest get `late_s` more, then
  are left out (a stopped engine accepts connections and never answers).
`version` is the minimum weight version across the engines in service (the oldest policy a
token sampled from now on can carry); `behind()` names every engine out of service, its last
version and why; `serving()` is the URLs in service, which the weight sync hands the proxy's
router (`RoutedBackend.serve_only`) so that it routes only to engines holding the new weights.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from harnessrl.gym.backends.engine_client import EngineClient, EngineError


@dataclass
class FleetEngine:
    """One engine of the fleet: its client, whether it serves, and the weights it holds."""

    client: EngineClient
    in_service: bool = True
    version: str | None = None
    """The weight version it last loaded (None: whatever it started with)."""
    reason: str = ""
    """Why it is out of service."""

    @property
    def url(self) -> str:
        return self.client.base_url


def _as_int(version: str | None) -> int | None:
    try:
        return int(version) if version is not None else None
    except ValueError:
        return None


class EngineFleet:
    """Control calls fanned out to several engines (module doc)."""

    def __init__(self, urls: Sequence[str], *, timeout: float = 600.0, late_s: float = 60.0,
                 api_key: str | None = None):
        """`timeout`: each engine's own bound on a control call; `late_s`: how long the others
        wait for an engine once one has answered."""
        if not urls:
            raise ValueError("EngineFleet needs at least one engine URL")
        self.engines = [FleetEngine(EngineClient(u, timeout=timeout, api_key=api_key)) for u in urls]
        if len({e.url for e in self.engines}) != len(self.engines):
            raise ValueError(f"engine URLs must differ: {list(urls)}")
        self.base_url = self.engines[0].url
        """The first engine (for messages and the vLLM adapter route; the fleet speaks SGLang's)."""
        self.timeout = timeout
        self.late_s = late_s
        self.lora_name: str | None = None
        self.last_call: dict[str, str] = {}
        """The last fan-out call's outcome per engine: "ok", or the error."""

    # ---- the fan-out ------------------------------------------------------------------------
    async def _fan(self, what: str, call: Callable[[EngineClient], Awaitable[Any]], *, every: bool = False,
                   on_ok: Callable[[FleetEngine], None] | None = None) -> list[Any]:
        """`call` on each target engine at once (in service; `every`: all of them); failures
        are taken out of service; the successes' results, or an EngineError if there are none."""
        targets = [e for e in self.engines if every or e.in_service]
        if not targets:
            raise EngineError(f"{what}: no engine in service ({self._reasons()})")
        tasks = {asyncio.ensure_future(call(e.client)): e for e in targets}
        pending, first_done = set(tasks), None
        while pending:
            limit = None if first_done is None else max(0.0, first_done + self.late_s - time.monotonic())
            done, pending = await asyncio.wait(pending, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # the late ones: left out, the others go on
                break
            first_done = first_done or time.monotonic()
        for t in pending:
            t.cancel()
            self._out(tasks[t], f"{what}: no answer within {self.late_s:g} s of the other engines")
        results = []
        for t, e in tasks.items():
            if t in pending:
                continue
            err = t.exception()
            if err is None:
                self.last_call[e.url] = "ok"
                if on_ok is not None:
                    on_ok(e)
                results.append(t.result())
            else:
                self._out(e, f"{what}: {type(err).__name__}: {err}")
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if not results:
            raise EngineError(f"{what} failed on every engine ({self._reasons()})")
        return results

    def _out(self, e: FleetEngine, reason: str) -> None:
        e.in_service, e.reason = False, reason
        self.last_call[e.url] = reason

    def _reasons(self) -> str:
        return "; ".join(f"{e.url}: {e.reason or 'in service'}" for e in self.engines)

    @staticmethod
    def _back(version: str | None) -> Callable[[FleetEngine], None]:
        def mark(e: FleetEngine) -> None:
            e.in_service, e.reason = True, ""
            if version is not None:
                e.version = version
        return mark

    # ---- the state ----------------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """The minimum weight version across the engines in service (None: none known)."""
        known = [v for v in (_as_int(e.version) for e in self.engines if e.in_service) if v is not None]
        return min(known) if known else None

    def serving(self) -> list[str]:
        """URLs of the engines in service."""
        return [e.url for e in self.engines if e.in_service]

    def behind(self) -> list[dict[str, Any]]:
        """Each engine out of service: url, the version it last loaded, and why it is out."""
        return [{"url": e.url, "version": e.version, "reason": e.reason} for e in self.engines if not e.in_service]

    def report(self) -> list[dict[str, Any]]:
        """Every engine: url, in_service, version, reason."""
        return [{"url": e.url, "in_service": e.in_service, "version": e.version, "reason": e.reason}
                for e in self.engines]

    # ---- the control calls of EngineClient ------------------------------------------------
    async def pause(self, mode: str = "abort") -> None:
        await self._fan("pause_generation", lambda c: c.pause(mode=mode))

    async def resume(self) -> None:
        await self._fan("continue_generation", lambda c: c.resume())

    async def update_weights_from_disk(self, model_path: str, weight_version: str, flush_cache: bool = True) -> dict:
        """Every engine loads `model_path` as `weight_version`; one that does comes (back) into service."""
        await self._fan("update_weights_from_disk", lambda c: c.update_weights_from_disk(
            model_path, weight_version, flush_cache), every=True, on_ok=self._back(weight_version))
        return {"success": True, "serving": self.serving(), "behind": self.behind()}

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        await self._fan("load_lora_adapter", lambda c: c.load_lora_adapter(lora_name, lora_path), every=True,
                        on_ok=self._back(None))
        return {"success": True, "serving": self.serving(), "behind": self.behind()}

    async def unload_lora_adapter(self, lora_name: str) -> dict:
        """To every engine; a 400 (not loaded there) is no failure, as `AdapterWeightSync` treats it."""
        async def unload(c: EngineClient) -> dict:
            try:
                return await c.unload_lora_adapter(lora_name)
            except EngineError as e:
                if e.status_code != 400:
                    raise
                return {"success": True}
        await self._fan("unload_lora_adapter", unload, every=True)
        return {"success": True}

    async def update_weight_version(self, version: str, abort_all_requests: bool = False) -> dict:
        await self._fan("update_weight_version", lambda c: c.update_weight_version(version, abort_all_requests),
                        on_ok=self._back(version))
        return {"success": True}

    async def flush_cache(self) -> None:
        await self._fan("flush_cache", lambda c: c.flush_cache())

    async def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        await self._fan("abort_request", lambda c: c.abort(rid, abort_all))

    async def health(self) -> bool:
        """Does any engine in service answer /health?"""
        live = [e for e in self.engines if e.in_service]
        return any(await asyncio.gather(*(e.client.health() for e in live))) if live else False

    async def model_info(self) -> dict:
        """The first engine in service's."""
        live = [e for e in self.engines if e.in_service] or self.engines
        return await live[0].client.model_info()

    async def read_versions(self) -> dict[str, str | None]:
        """Each engine's weight version as it reports it (`/get_model_info`; None: no answer)."""
        async def one(e: FleetEngine) -> str | None:
            try:
                v = (await e.client.model_info()).get("weight_version")
            except EngineError:
                return None
            return None if v is None else str(v)
        got = await asyncio.gather(*(one(e) for e in self.engines))
        return {e.url: v for e, v in zip(self.engines, got)}

    def use_lora(self, name: str | None) -> None:
        self.lora_name = name
        for e in self.engines:
            e.client.use_lora(name)

    async def aclose(self) -> None:
        await asyncio.gather(*(e.client.aclose() for e in self.engines), return_exceptions=True)
