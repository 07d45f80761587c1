"""Sandboxes: where one episode's copy of a repository lives while a harness works on it.

`make_backend("auto" | a `BACKENDS` name | "module:Class", config)` returns a backend whose
`create(spec: RepoSpec, mounts=(), env=None) -> Sandbox`; `SandboxPool` keeps sandboxes warm.
"auto" tries `AUTO` in order (docker when an engine answers, else bubblewrap), else raises
SandboxUnavailable. A config names a backend with the `SandboxName` field type.
"""
from __future__ import annotations

from typing import Any

from harnessrl.registry import arg_type, check, choice, resolve
from harnessrl.sandboxes.base import (ExecResult, RepoSpec, Sandbox, SandboxBackend, SandboxDied,
                                      SandboxError, SandboxUnavailable)

#: Backend name -> "module:Class" (imported lazily; a full "module:Class" path works too).
BACKENDS: dict[str, str] = {
    "docker": "harnessrl.sandboxes.docker:DockerBackend",
    "local": "harnessrl.sandboxes.local:LocalBackend",
}

__all__ = ["AUTO", "BACKENDS", "SandboxName", "backend_class", "sandbox_arg", "make_backend", "ExecResult", "RepoSpec", "Sandbox",
           "SandboxBackend", "SandboxDied", "SandboxError", "SandboxUnavailable", "SandboxPool", "PoolConfig"]


#: The order "auto" tries backends in (the first that starts wins).
AUTO: tuple[str, ...] = ("docker", "local")

#: A sandbox backend's name as a config field: a `BACKENDS` name, "auto" or a "module:Class"
#: path; anything else is refused when the config is validated, listing the valid names.
SandboxName = choice(BACKENDS, "sandbox backend", extra=("auto",))
#: The same as an argparse `type=` (`--sandbox`).
sandbox_arg = arg_type(BACKENDS, "sandbox backend", extra=("auto",))


def backend_class(name: str) -> type:
    """The backend class of a `BACKENDS` name or a "module:Class" path, imported lazily."""
    check(BACKENDS, name, "sandbox backend", extra=("auto",))
    return resolve(BACKENDS, name, "sandbox backend")


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
        return backend_class(name)(config.get(name) if isinstance(config, dict) else config)
    reasons = []
    for candidate in AUTO:
        try:
            return backend_class(candidate)(_config_for(candidate, config))
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
