"""LoRA adapters on the local engine: SGLang's and vLLM's adapter-loading routes.

Routes (request bodies as the two servers define them):
- `POST /load_lora_adapter {lora_name, lora_path, pinned?}` and `POST /unload_lora_adapter
  {lora_name}` (SGLang's `LoadLoRAAdapterReqInput` / `UnloadLoRAAdapterReqInput`) ->
  `{success, error_message, loaded_adapters: {name: path}}`; a refused load is a 400 with
  `success: false`.
- `POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?}` and
  `POST /v1/unload_lora_adapter {lora_name}` (vLLM's) -> plain-text success, or a 400
  `{"error": {"message": ...}}`; a name already loaded needs `load_inplace: true`, as in vLLM.
- `POST /update_weight_version {new_version, abort_all_requests?}` (SGLang's): the version
  stamped on tokens from now on, with no weight change; an adapter sync sets it after loading.

The engine serves one policy: at most one adapter is loaded, and it applies to every request;
a /generate `lora_path` (SGLang's per-request adapter name) must name that adapter or is
refused with a 400 (a vLLM-route request's `model` is not read). Loading folds the adapter into the served
weights as base + (alpha / r) * B @ A on each adapted layer, the base tensors kept aside so that
the next adapter replaces this one instead of stacking on it; unloading restores the base.
Folding keeps the decode paths (fast decode, the C step) exactly as they are, and in float32
the served logprobs match a peft model's to rounding (~1e-6). A full-weight update
(`/update_weights_from_disk`) is a new base: the adapter it replaced counts as unloaded.
Adapter folders are peft's (`adapter_config.json` + `adapter_model.safetensors`); plain LoRA
only (no DoRA, no per-module rank or alpha patterns, no extra trained modules).
"""
from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from harnessrl.trainers.engine.protocol import BadRequest, parse_body
from harnessrl.trainers.engine.weights import WeightLoadError


class LoadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    pinned: StrictBool = False
    load_inplace: StrictBool = False


class UnloadAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)


class WeightVersionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    new_version: str = Field(min_length=1)
    abort_all_requests: StrictBool = True


def read_adapter(folder: str | Path, model) -> dict[str, torch.Tensor]:
    """The adapter in `folder` as float32 weight deltas {parameter name: (alpha/r) * B @ A},
    checked against `model` (every adapted layer must exist with matching shapes)."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights

    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise WeightLoadError(f"lora_path {str(folder)!r} has no adapter_config.json (save with peft's save_pretrained)")
    try:
        cfg = LoraConfig.from_pretrained(str(folder))
        tensors = load_peft_weights(str(folder), device="cpu")
    except Exception as e:  # peft and safetensors raise their own types for unreadable files
        raise WeightLoadError(f"{folder}: cannot read the adapter ({e})") from e
    unsupported = [what for what, bad in (
        ("use_dora", getattr(cfg, "use_dora", False)), ("rank_pattern", getattr(cfg, "rank_pattern", None)),
        ("alpha_pattern", getattr(cfg, "alpha_pattern", None)), ("modules_to_save", cfg.modules_to_save),
        ("fan_in_fan_out", cfg.fan_in_fan_out), ("bias", cfg.bias != "none")) if bad]
    if unsupported:
        raise WeightLoadError(f"{folder}: adapter_config sets {', '.join(unsupported)}; the local engine "
                              "serves plain LoRA only")
    scale = cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
    params = dict(model.named_parameters())
    deltas: dict[str, torch.Tensor] = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            if ".lora_B." not in key:
                raise WeightLoadError(f"{folder}: tensor {key} is not a LoRA A or B matrix")
            continue
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        name = f"{module}.weight"
        if b is None:
            raise WeightLoadError(f"{folder}: {key} has no lora_B partner")
        if name not in params:
            raise WeightLoadError(f"{folder}: adapts {module}, which the model does not have")
        delta = scale * (b.to(torch.float32) @ a.to(torch.float32))
        if tuple(delta.shape) != tuple(params[name].shape):
            raise WeightLoadError(f"{folder}: {module}: B @ A is {tuple(delta.shape)}, the layer is "
                                  f"{tuple(params[name].shape)}")
        deltas[name] = delta
    if not deltas:
        raise WeightLoadError(f"{folder}: the adapter holds no LoRA matrices")
    return deltas


class AdapterSlot:
    """The one adapter folded into the served weights, and the base tensors it replaced.
    Every method runs on the scheduler thread (between two steps)."""

    def __init__(self):
        self.name: str | None = None
        self.path = ""
        self._base: dict[str, torch.Tensor] = {}
        self._stamp: dict[str, int] = {}

    def _current(self, params: dict[str, torch.nn.Parameter]) -> bool:
        """Whether the folded weights are still in place (no full-weight update since)."""
        return all(params[n]._version == v for n, v in self._stamp.items())

    def loaded(self, model) -> dict[str, str]:
        if self.name is not None and not self._current(dict(model.named_parameters())):
            self.name, self._base, self._stamp = None, {}, {}  # a new base was loaded over it
        return {self.name: self.path} if self.name is not None else {}

    @torch.no_grad()
    def load(self, model, name: str, path: str, deltas: dict[str, torch.Tensor]) -> None:
        params = dict(model.named_parameters())
        self.loaded(model)  # forget an adapter a full-weight update replaced
        self.unload(model)
        for n, delta in deltas.items():
            p = params[n]
            self._base[n] = p.detach().clone()
            p.copy_((p.float() + delta.to(p.device)).to(p.dtype))
        self._stamp = {n: params[n]._version for n in deltas}
        self.name, self.path = name, path

    @torch.no_grad()
    def unload(self, model) -> None:
        params = dict(model.named_parameters())
        if self._base and self._current(params):
            for n, base in self._base.items():
                params[n].copy_(base)
        self.name, self.path, self._base, self._stamp = None, "", {}, {}


class LoraRoutes:
    """The adapter routes over one engine state (`server.EngineState`)."""

    def __init__(self, state: Any):
        self.state, self.sched = state, state.scheduler
        self.slot: AdapterSlot = state.adapter

    def mount(self, app: FastAPI) -> None:
        app.post("/load_lora_adapter")(self.load_sglang)
        app.post("/unload_lora_adapter")(self.unload_sglang)
        app.post("/v1/load_lora_adapter")(self.load_vllm)
        app.post("/v1/unload_lora_adapter")(self.unload_vllm)
        app.post("/update_weight_version")(self.update_weight_version)

    async def _loaded(self) -> dict[str, str]:
        return await asyncio.wrap_future(self.sched.call(lambda s: self.slot.loaded(s.model)))

    async def _load(self, body: LoadAdapterRequest) -> None:
        """Read and check off the scheduler thread, fold in between two steps; WeightLoadError if refused."""
        async with self.state.update_lock:
            deltas = await asyncio.to_thread(read_adapter, body.lora_path, self.sched.model)

            def swap(s) -> None:
                self.slot.load(s.model, body.lora_name, body.lora_path, deltas)
                s.weights_changed()  # no KV of the old weights is served again

            await asyncio.wrap_future(self.sched.call(swap))

    async def _unload(self, name: str) -> None:
        if name not in await self._loaded():
            raise WeightLoadError(f"lora_name: adapter {name!r} is not loaded")
        async with self.state.update_lock:
            def swap(s) -> None:
                self.slot.unload(s.model)
                s.weights_changed()

            await asyncio.wrap_future(self.sched.call(swap))

    # -- SGLang ------------------------------------------------------------------------------
    async def _sglang(self, request: Request, body_type, act) -> JSONResponse:
        try:
            body = parse_body(await request.body(), body_type)
            await act(body)
        except (BadRequest, WeightLoadError) as e:
            return JSONResponse({"success": False, "error_message": str(e), "loaded_adapters": await self._loaded()},
                                status_code=400)
        return JSONResponse({"success": True, "error_message": None, "loaded_adapters": await self._loaded()})

    async def load_sglang(self, request: Request):
        return await self._sglang(request, LoadAdapterRequest, self._load)

    async def unload_sglang(self, request: Request):
        return await self._sglang(request, UnloadAdapterRequest, lambda b: self._unload(b.lora_name))

    async def update_weight_version(self, request: Request):
        try:
            body = parse_body(await request.body(), WeightVersionRequest)
        except BadRequest as e:
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)

        def bump(s) -> None:
            if body.abort_all_requests:
                s._abort_everything("aborted for a weight version update")
            s.weight_version = body.new_version

        await asyncio.wrap_future(self.sched.call(bump))
        return JSONResponse({"success": True, "message": f"Weight version updated to {body.new_version}",
                             "new_version": body.new_version})

    # -- vLLM --------------------------------------------------------------------------------
    async def load_vllm(self, request: Request):
        try:
            body = parse_body(await request.body(), LoadAdapterRequest)
            if body.lora_name in await self._loaded() and not body.load_inplace:
                raise BadRequest(f"The lora adapter '{body.lora_name}' has already been loaded. "
                                 "If you want to load the adapter in place, set 'load_inplace' to True.")
            await self._load(body)
        except (BadRequest, WeightLoadError) as e:
            return JSONResponse({"error": {"message": str(e), "type": "BadRequestError", "code": 400}},
                                status_code=400)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload_vllm(self, request: Request):
        try:
            body = parse_body(await request.body(), UnloadAdapterRequest)
        except BadRequest as e:
            return JSONResponse({"error": {"message": str(e), "type": "BadRequestError", "code": 400}},
                                status_code=400)
        try:
            await self._unload(body.lora_name)
        except WeightLoadError as e:
            return JSONResponse({"error": {"message": str(e), "type": "NotFoundError", "code": 404}},
                                status_code=404)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
