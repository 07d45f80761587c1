"""Weight sync for a LoRA trainer: only the adapter where the engine loads adapters, else merged weights.

Contract: `AdapterWeightSync.push(trainer)` takes a trainer with `publish_adapter` (the torch
trainer with `lora` set), writes peft's adapter folder (megabytes) into `root/v{version}-lora`
and loads it on the engine inside the same pause as `DiskWeightSync` (proxy admission paused,
engine paused with abort, then continued, then admission resumed), so every token still
carries the version that sampled it:
- `api="sglang"` (the local engine, SGLang with `--enable-lora`): `/unload_lora_adapter` of
  the previous adapter (SGLang refuses a name already loaded), `/load_lora_adapter {lora_name,
  lora_path}`, then `/update_weight_version {new_version}`. A real SGLang serves the adapter
  only to requests that name it (`lora_path: lora_name` in /generate), so inside the same pause
  the gate (the proxy) is told to name it in every generation (`use_lora`); the local engine
  serves its one adapter to every request and refuses any other name.
- `api="vllm"` (vLLM with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): `/v1/load_lora_adapter
  {lora_name, lora_path, load_inplace: true}`; vLLM's replies name no version, so
  `on_version(version)` is called inside the pause (e.g. the proxy's `VllmBackend.set_weight_version`);
  requests select the adapter by `model: lora_name` (the gate's `use_lora` again).
When the engine has no such route (404), or `adapters=False`, every push publishes merged full
weights through `DiskWeightSync` (`/update_weights_from_disk`) instead. The folder must be
readable by the engine (same machine or a shared path), as for full weights.
"""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Literal

import httpx

from harnessrl.gym.backends.engine_client import EngineClient, EngineError
from harnessrl.trainers.weight_sync import DiskWeightSync, paused, served_version


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder` (what a sync hands the engine)."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


class AdapterWeightSync:
    """A LoRA trainer's policy to the engine: the adapter (module doc), merged weights as the fallback."""

    def __init__(self, client: EngineClient, root: str | Path, *, api: Literal["sglang", "vllm"] = "sglang",
                 lora_name: str = "policy", keep: int = 2, gate: Any = None, adapters: bool = True,
                 on_version: Callable[[int], Any] | None = None, api_key: str | None = None):
        self.client, self.root, self.api, self.lora_name = client, Path(root), api, lora_name
        self.keep = keep
        self.adapters = adapters
        """False once the engine showed it has no LoRA route (or when asked): merged weights from then on."""
        self.on_version = on_version
        self.api_key = api_key
        self.full = DiskWeightSync(client, self.root, keep=keep, gate=gate)
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        self.last_mode: Literal["adapter", "merged", ""] = ""
        self._loaded = False

    @property
    def gate(self) -> Any:
        """The proxy (sync `pause()` / `resume()`), paused around each load, merged ones included."""
        return self.full.gate

    @gate.setter
    def gate(self, gate: Any) -> None:
        self.full.gate = gate

    async def push(self, trainer) -> int:
        """Publish the trainer's policy to the engine (adapter, else merged); returns its version."""
        t0 = time.monotonic()
        if self.adapters:
            target = self.root / f"v{trainer.version}-lora"
            version = await asyncio.to_thread(trainer.publish_adapter, target)
            try:
                await self.load(target, version)
            except EngineError as e:
                if e.status_code not in (404, 405):
                    raise
                self.adapters = False  # no LoRA route on this engine: merged weights from now on
            else:
                self._done("adapter", target, t0)
                return served_version(self.client, version)
        version = await self.full.push(trainer)  # (only ever before an adapter loaded: nothing to unname)
        self._done("merged", self.root / f"v{version}", t0)
        return version

    async def load(self, folder: str | Path, version: int) -> None:
        """Inside the pause: the adapter in `folder` loaded as the policy, stamped `version`."""
        async with paused(self.client if self.api == "sglang" else None, self.gate):
            if self.api == "sglang":
                if self._loaded:
                    try:  # a full-weight update since may have dropped it already: that is fine
                        await self.client.unload_lora_adapter(self.lora_name)
                    except EngineError as e:
                        if e.status_code != 400:
                            raise
                    self._loaded = False
                await self.client.load_lora_adapter(self.lora_name, str(folder))
                self._loaded = True
                await self.client.update_weight_version(str(version))
            else:
                await self._vllm_load(str(folder))
                self._loaded = True
            self._select(self.lora_name)
            if self.on_version is not None:
                self.on_version(version)

    def _select(self, name: str | None) -> None:
        """The proxy (the gate) names adapter `name` in its generations from now on (None: none),
        inside the pause, so no call is sampled under a name the engine does not hold."""
        select = getattr(self.gate, "use_lora", None)
        if select is not None:
            select(name)

    async def _vllm_load(self, folder: str) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.client.base_url + "/v1/load_lora_adapter"
        body = {"lora_name": self.lora_name, "lora_path": folder, "load_inplace": True}
        try:
            async with httpx.AsyncClient(timeout=self.client.timeout, headers=headers) as http:
                resp = await http.post(url, json=body)
        except httpx.HTTPError as e:
            raise EngineError(f"engine at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise EngineError(f"engine at {url} answered HTTP {resp.status_code}: {resp.text[:300]}", resp.status_code)

    def _done(self, mode: Literal["adapter", "merged"], folder: Path, t0: float) -> None:
        self.last_mode, self.last_sync_bytes = mode, folder_bytes(folder)
        self._prune()
        self.last_sync_s = time.monotonic() - t0

    def _prune(self) -> None:
        def version(p: Path) -> int:
            return int(p.name[1:].removesuffix("-lora"))

        folders = [p for p in self.root.glob("v*") if p.name[1:].removesuffix("-lora").isdigit()]
        for old in sorted(folders, key=version)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
