"""The generic adapter: any harness CLI described by a small TOML/YAML file, no module needed.

A config names the command, its environment and the config files to write, all as
templates over `${var}` (string.Template; `$$` is a literal $), plus the dialect, the
placement and how completion is read. Variables:

    task, model, api_key, base_url (session URL without /v1; seen from where it runs),
    openai_base_url (base_url + "/v1"), workdir (repo in the sandbox), scratch (private
    dir: host for beside, /tmp/harnessrl in the sandbox for inside), max_calls,
    wall_time_s, toolchain (toolchain root as the harness sees it),
    exec_socket + bridge_dir (beside only: run commands in the sandbox through the exec
    bridge; bridge_dir holds harnessrl_mini_env.py, a mini-swe-agent environment class)

Inside harnesses run in the sandbox through the relay (adapters/inside.py) with the npm
prefix named by `npm_prefix` on PATH; beside ones run on the host in `scratch`.
See examples/harnesses/*.toml.
"""
from __future__ import annotations

import json
import re
import shutil
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.adapters.base import (REASONS, Endpoint, SANDBOX_SCRATCH, TOOLCHAIN_MOUNT, HarnessResult, Launch, Mount,
                                     classify_exit, tail)
from harnessrl.adapters.exec_bridge import ExecBridge
from harnessrl.adapters.inside import inside_mounts, run_inside
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.adapters.toolchain import toolchain_root

MINI_ENV = Path(__file__).with_name("mini_env.py")


class CompletionConfig(BaseModel):
    """How the end of a run is read."""

    model_config = ConfigDict(extra="forbid")
    status_file: str | None = None
    """Template of a JSON file the harness writes (beside: host path) holding its own end status."""
    status_key: str = "info.exit_status"
    """Dotted path of the status inside status_file."""
    status_reasons: dict[str, str] = Field(default_factory=dict)
    """Harness status -> reason (one of submitted, harness_exited, call_limit, timeout, harness_crashed)."""
    stdout_reasons: dict[str, str] = Field(default_factory=dict)
    """Regex found in stdout -> reason, checked in order, when status_file gives none."""


class CommandConfig(BaseModel):
    """One harness as a command. Unknown keys are rejected so a typo is loud."""

    model_config = ConfigDict(extra="forbid")
    name: str
    """Harness name recorded in trajectories."""
    version: str = "unknown"
    """The harness version this config was written for."""
    install: str = "none"
    """How it is installed ("npm:<spec>", "pip:<spec>", "none": user-provided)."""
    dialect: Literal["openai-chat", "openai-responses", "anthropic"]
    """API dialect it speaks."""
    placement: Literal["inside", "beside"]
    """Run in the sandbox (through the relay) or on the host beside it."""
    streams: bool = False
    """Whether it streams by default (informational)."""
    command: list[str] = Field(min_length=1)
    """argv templates."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment templates (beside: on top of a minimal host env)."""
    files: dict[str, str] = Field(default_factory=dict)
    """path template -> content template, written before the run (inside: sandbox paths)."""
    npm_prefix: str | None = None
    """Inside only: toolchain npm prefix whose bin/ goes on PATH (e.g. "codex")."""
    completion: CompletionConfig = Field(default_factory=CompletionConfig)


class CommandAdapter:
    """Instances carry their capabilities from the config (class attributes are defaults)."""

    completion = "per config: exit code, a status file, or a stdout pattern"

    def __init__(self, config: CommandConfig | dict[str, Any]):
        self.config = config if isinstance(config, CommandConfig) else CommandConfig.model_validate(config)
        c = self.config
        self.name, self.dialect, self.placement, self.streams = c.name, c.dialect, c.placement, c.streams
        self.version, self.install = c.version, c.install
        for reason in [*c.completion.status_reasons.values(), *c.completion.stdout_reasons.values()]:
            if reason not in REASONS:
                raise ValueError(f"command adapter {c.name!r}: completion reason {reason!r} not one of {REASONS}")

    @classmethod
    def from_file(cls, path: str | Path) -> "CommandAdapter":
        p = Path(path)
        text = p.read_text()
        if p.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise ValueError(f"{p}: TOML configs need Python >= 3.11; use the same keys in YAML") from None
            data = tomllib.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
        try:
            return cls(data)
        except ValueError as e:
            raise ValueError(f"{p}: invalid harness config: {e}") from None

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        return inside_mounts(endpoint, toolchain) if self.placement == "inside" else []

    def _vars(self, launch: Launch, inside: bool, scratch: str, **extra: str) -> dict[str, str]:
        ep = launch.endpoint
        base = ep.inside_base_url if inside else ep.base_url
        root = TOOLCHAIN_MOUNT if inside else str(launch.toolchain or toolchain_root())
        return {"task": launch.problem_statement, "model": ep.model, "api_key": ep.api_key, "base_url": base,
                "openai_base_url": f"{base}/v1", "workdir": launch.sandbox.workdir, "scratch": scratch,
                "max_calls": str(launch.limits.max_calls), "wall_time_s": str(int(launch.limits.wall_time_s)),
                "toolchain": root, **extra}

    def _fill(self, template: str, v: dict[str, str]) -> str:
        try:
            return string.Template(template).substitute(v)
        except (KeyError, ValueError) as e:
            raise ValueError(f"command adapter {self.name!r}: template {template!r}: unknown or bad "
                             f"variable {e}; known: {sorted(v)}") from None

    def launch(self, launch: Launch) -> HarnessResult:
        c = self.config
        if c.placement == "inside":
            v = self._vars(launch, True, SANDBOX_SCRATCH)
            env = {k: self._fill(t, v) for k, t in c.env.items()}
            if c.npm_prefix:
                env.setdefault("PATH", f"{TOOLCHAIN_MOUNT}/npm/{c.npm_prefix}/bin:{TOOLCHAIN_MOUNT}/node/bin:"
                                       "/usr/local/bin:/usr/bin:/bin")
            env.setdefault("HOME", f"{SANDBOX_SCRATCH}/home")
            files = {self._fill(p, v): self._fill(t, v).encode() for p, t in c.files.items()}
            run = run_inside(launch, [self._fill(a, v) for a in c.command], env, files)
            status_text = None
            if c.completion.status_file:
                try:
                    status_text = launch.sandbox.read_file(self._fill(c.completion.status_file, v)).decode()
                except Exception:  # noqa: BLE001 - no status file: the harness ended before writing it
                    status_text = None
            return self._result(run.exit_code, run.timed_out, run.stdout, run.stderr, run.duration_s, status_text)
        scratch = Path(launch.scratch_dir)
        scratch.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MINI_ENV, scratch / "harnessrl_mini_env.py")
        sock = str(scratch / "exec.sock")
        v = self._vars(launch, False, str(scratch), exec_socket=sock, bridge_dir=str(scratch))
        for p, t in c.files.items():
            path = Path(self._fill(p, v))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self._fill(t, v))
        env = clean_env({k: self._fill(t, v) for k, t in c.env.items()})
        with ExecBridge(launch.sandbox, sock):
            run = run_host([self._fill(a, v) for a in c.command], env, str(scratch), launch.limits.wall_time_s,
                           launch.cancel)
        status_text = None
        if c.completion.status_file:
            sf = Path(self._fill(c.completion.status_file, v))
            status_text = sf.read_text() if sf.is_file() else None
        return self._result(run.exit_code, run.timed_out, run.stdout, run.stderr, run.duration_s, status_text)

    def _result(self, exit_code, timed_out, stdout, stderr, duration, status_text) -> HarnessResult:
        comp = self.config.completion
        status = _dig(status_text, comp.status_key) if status_text else None
        reason = classify_exit(exit_code, timed_out)
        if not timed_out:
            if status is not None and status in comp.status_reasons:
                reason = comp.status_reasons[status]
            else:
                for pattern, r in comp.stdout_reasons.items():
                    if re.search(pattern, stdout):
                        reason = r
                        break
        return HarnessResult(reason, exit_code, status, tail(stdout), tail(stderr), duration)


def _dig(text: str, dotted: str) -> str | None:
    try:
        obj: Any = json.loads(text)
        for key in dotted.split("."):
            obj = obj[key]
        return str(obj)
    except (ValueError, KeyError, TypeError, IndexError):
        return None
