"""Weight sync: trainer weights -> engine, stamped with a version.

Contract: `DiskWeightSync.push(trainer)` saves the trainer's weights (safetensors +
tokenizer) into `root/v{version}`, then pause -> `/update_weights_from_disk` with
`weight_version` -> continue on the engine, the order SGLang documents. Given the proxy as
`gate` (anything with `pause()` / `resume()`, e.g. `ProxyServer`), proxy admission is paused
around that sequence: new model calls wait at the proxy instead of queueing at a paused
engine, and the requests running at the engine's pause come back `abort` with their partial
output and wait there too, then resume on the new weights, so every token keeps the
version that sampled it. Harnesses see a slower reply, never an error. The same calls work
unchanged against a real SGLang server (the folder must be readable by it). Old version
folders beyond `keep` are deleted.
"""
from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from harnessrl.gym.backends.engine_client import EngineClient
from harnessrl.gym.backends.fleet import EngineFleet


@contextlib.asynccontextmanager
async def paused(client: EngineClient | EngineFleet | None, gate: Any = None):
    """Proxy admission paused (`gate`, if any) -> engine paused with abort (`client`, if any);
    on exit, even after a failure, the engine continued and then the proxy resumed."""
    import asyncio

    if gate is not None:
        await asyncio.to_thread(gate.pause)
    try:
        if client is None:
            yield
            return
        await client.pause(mode="abort")
        try:
            yield
        finally:
            try:
                await client.resume()
            finally:
                await route(client, gate)
    finally:
        if gate is not None:
            await asyncio.to_thread(gate.resume)


async def route(client: Any, gate: Any) -> None:
    """Tell the proxy (`gate.use_engines`) which engines of a fleet (`client.serving()`) are in
    service, so that no call reaches an engine the sync left behind; a no-op for one engine."""
    import asyncio

    serving, use = getattr(client, "serving", None), getattr(gate, "use_engines", None)
    if serving is not None and use is not None:
        await asyncio.to_thread(use, serving())


def served_version(client: Any, version: int) -> int:
    """The version pushed, or the minimum across a fleet's engines in service when that is lower."""
    v = getattr(client, "version", None)
    return min(version, v) if isinstance(v, int) else version


class DiskWeightSync:
    def __init__(self, client: EngineClient | EngineFleet, root: str | Path, keep: int = 2, gate: Any = None):
        self.client = client
        self.root = Path(root)
        self.keep = keep
        self.gate = gate
        """The proxy (sync `pause()` / `resume()`), paused around each update; None: engine only."""
        self.last_sync_s = 0.0

    async def push(self, trainer) -> int:
        """Publish the trainer's weights to the engine; returns the new version."""
        import asyncio

        t0 = time.monotonic()
        target = self.root / f"v{trainer.version}"
        version = await asyncio.to_thread(trainer.publish, target)
        await self.load(target, version)
        self._prune()
        self.last_sync_s = time.monotonic() - t0
        return served_version(self.client, version)

    async def load(self, folder: str | Path, version: int) -> None:
        """Proxy admission paused -> engine paused (abort) -> weights loaded as `version` ->
        engine continued -> proxy admission resumed (each undone even if a step fails)."""
        async with paused(self.client, self.gate):
            await self.client.update_weights_from_disk(str(folder), weight_version=str(version))

    def _prune(self) -> None:
        versions = sorted((p for p in self.root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
