"""Sandboxes: where one episode's copy of a repository lives while a harness works on it.

`make_backend("auto" | "docker" | "local" | "module:Class", config)` returns a backend whose
`create(spec: RepoSpec, mounts=(), env=None) -> Sandbox`; `SandboxPool` keeps sandboxes warm.
"auto" picks docker when an engine answers, else bubblewrap, else raises SandboxUnavailable.
"""
from __future__ import annotations

import importlib
from typing import Any

from harnessrl.sandboxes.base import (ExecResult, RepoSpec, Sandbox, SandboxBackend, SandboxDied,
                                      SandboxError, SandboxUnavailable)

#: Backend name -> "module:Class" (imported lazily; a full "module:Class" path works too).
BACKENDS: dict[str, str] = {
    "docker": "harnessrl.sandboxes.docker:DockerBackend",
    "local": "harnessrl.sandboxes.local:LocalBackend",
}

__all__ = ["BACKENDS", "make_backend", "ExecResult", "RepoSpec", "Sandbox", "SandboxBackend", "SandboxDied",
           "SandboxError", "SandboxUnavailable", "SandboxPool", "PoolConfig"]


def _load(name: str) -> type:
    target = BACKENDS.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown sandbox backend {name!r}; valid: auto, {', '.join(BACKENDS)} "
                         "or a 'module:Class' path")
    module, cls = target.split(":", 1)
    return getattr(importlib.import_module(module), cls)


def _config_for(name: str, config: Any) -> Any:
    """With "auto", `config` may be {"docker": DockerConfig, "local": LocalConfig} or one of them."""
    if isinstance(config, dict):
        return config.get(name)
    if config is not None and not type(config).__name__.lower().startswith(name):
        return None
    return config


def make_backend(name: str = "auto", config: Any = None) -> Any:
    """Instantiate a backend; `config` is that backend's Config (or None for defaults)."""
    if name != "auto":
        return _load(name)(config[name] if isinstance(config, dict) else config)
    reasons = []
    for candidate in ("docker", "local"):
        try:
            return _load(candidate)(_config_for(candidate, config))
        except SandboxUnavailable as e:
            reasons.append(f"{candidate}: {e}")
    raise SandboxUnavailable("no sandbox backend works here. Fix one: install docker.io and start "
                             "dockerd (scripts/setup.sh), or install bubblewrap "
                             "(apt-get install bubblewrap). Details: " + "; ".join(reasons))


def __getattr__(name: str) -> Any:  # SandboxPool without importing the pool at package import
    if name in ("SandboxPool", "PoolConfig"):
        from harnessrl.sandboxes import pool
        return getattr(pool, name)
    raise AttributeError(name)
