"""The generic adapter: any harness CLI described by a small TOML/YAML file, no module needed.

A config names the command, its environment and the config files to write, all as
templates over `${var}` (string.Template; `$$` is a literal $), plus the dialect, the
placement and how completion is read. Variables:

    task, model, api_key, base_url (session URL without /v1; seen from where it runs),
    openai_base_url (base_url + "/v1"), workdir (repo in the sandbox), scratch (private
    dir: host for beside, /tmp/harnessrl in the sandbox for inside), max_calls,
    wall_time_s, toolchain (toolchain root as the harness sees it), bin (the bin dir of the
    config's own `install` as the harness sees it: the npm prefix's or the venv's; else ""),
    exec_socket + bridge_dir (beside only: run commands in the sandbox through the exec
    bridge; bridge_dir holds harnessrl_mini_env.py, a mini-swe-agent environment class),
    exec_client (beside only: `harnessrl-exec` in bridge_dir, a shell for the harness that
    runs each command in the sandbox: adapters/exec_client.py; its env HARNESSRL_EXEC_SOCKET
    and HARNESSRL_EXEC_CWD are set unless the config sets them)

Inside harnesses run in the sandbox through the relay (adapters/inside.py) with the npm
prefix named by `npm_prefix` (or an inside pip install's bin/) on PATH; beside ones run on the
host in `scratch`.
`install = "npm:<pkg>@<x.y.z>"` / `"pip:<pkg>==<v>"` is installed by `harnessrl harness
install CONFIG` (adapters/install.py) into <toolchain>/npm/<npm_prefix or name> or
<toolchain>/venvs/<venv or name> (beside) or, built for the sandbox's python3 by
adapters/pip_inside.py, <toolchain>/pip/<venv or name> (inside); until it is, `launch` raises HarnessNotInstalled naming that
command (nothing installs on first use: episodes run in parallel). `node` is a requirement
on the toolchain's node, `mounts` extra read-only host paths in the sandbox
(adapters/host_mounts.py). See examples/harnesses/*.toml.
"""
from __future__ import annotations

import json
import re
import shutil
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harnessrl.adapters.base import (REASONS, Endpoint, SANDBOX_SCRATCH, TOOLCHAIN_MOUNT, HarnessResult, Launch, Mount,
                                     classify_exit, tail)
from harnessrl.adapters.exec_bridge import ExecBridge
from harnessrl.adapters.host_mounts import parse_mounts
from harnessrl.adapters.inside import inside_mounts, run_inside
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.adapters.toolchain import (HarnessNotInstalled, InstallSpec, check_node, installed_spec, node_version,
                                          parse_install, require, stamp_for, toolchain_root)
from harnessrl.registry import Dialect

MINI_ENV = Path(__file__).with_name("mini_env.py")
EXEC_CLIENT = Path(__file__).with_name("exec_client.py")


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
    """How it is installed: "npm:<package>@<x.y.z>" or "pip:<package>==<version>" (one exact
    version; `harnessrl harness install CONFIG` puts it in the toolchain) or "none" (user-provided)."""
    node: str | None = None
    """Node versions the harness runs on, a PEP 440 specifier set (">=20", ">=18.17,<23"),
    checked against the toolchain's node at install and at launch."""
    node_runtime: str | None = None
    """npm install only: an exact node version ("22.23.5") npm installs into the harness's own
    prefix (first on its PATH) when the toolchain's node is too old for it."""
    venv: str | None = None
    """pip install only: the install's folder under <toolchain>/venvs (beside) or <toolchain>/pip
    (inside) (default: name)."""
    python: str | None = None
    """Inside pip install only: the Python versions the harness runs on, a PEP 440 specifier set
    (">=3.12"), checked against the sandbox image's python3 at install and at launch."""
    mounts: list[str] = Field(default_factory=list)
    """Extra host paths mounted read-only into the sandbox: "HOST" (same path) or "HOST:TARGET"."""
    dialect: Dialect
    """API dialect it speaks: a name in `harnessrl.registry.DIALECTS` ("openai-chat",
    "openai-responses", "anthropic", "gemini"; the older "openai_chat", "openai_responses" and
    "anthropic_messages" are read as those)."""
    placement: Literal["inside", "beside"]
    """Run in the sandbox (through the relay) or on the host beside it."""
    streams: bool = False
    """Whether it streams by default (informational)."""
    network: Literal["proxy-only", "host"] = "proxy-only"
    """Beside only: "proxy-only" runs the harness in a network namespace where only the proxy
    is reachable (adapters/netns.py); "host" opts out (the host's network). Recorded as the
    trajectory's `harness_network`."""
    command: list[str] = Field(min_length=1)
    """argv templates."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment templates (beside: on top of a minimal host env)."""
    files: dict[str, str] = Field(default_factory=dict)
    """path template -> content template, written before the run (inside: sandbox paths)."""
    npm_prefix: str | None = None
    """The toolchain npm prefix (<toolchain>/npm/<it>) whose bin/ goes on PATH inside; an npm
    `install` goes there (default: name)."""
    completion: CompletionConfig = Field(default_factory=CompletionConfig)
    after_install: list[str] = Field(default_factory=list)
    """A command `harnessrl harness install` runs once on the host right after installing, before
    the install's stamp is written, in the install's folder: argv templates over `prefix` (that
    folder) and `toolchain` (the toolchain root), with the prefix's bin/ and the toolchain's node
    first on PATH. What it writes into the folder is the install's, read-only in episodes: a
    harness that unpacks a bundled package on every start (Copilot CLI) unpacks it here once.
    Part of the stamp: changing it reinstalls. Not for inside pip installs (built elsewhere)."""
    after_install_env: dict[str, str] = Field(default_factory=dict)
    """Environment templates for `after_install` (same variables), on top of the host's."""

    @field_validator("install")
    @classmethod
    def _pinned(cls, v: str) -> str:
        parse_install(v)
        return v

    @field_validator("node")
    @classmethod
    def _node_spec(cls, v: str | None) -> str | None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            return v if v is None else str(SpecifierSet(v)) and v
        except InvalidSpecifier:
            raise ValueError(f"node {v!r} is not a version requirement like \">=20\" or \">=18.17,<23\"") from None

    python_runtime: Literal["3.13"] | None = None
    """Inside pip install only: run the harness on this CPython from the toolchain (Debian's,
    with its own glibc; adapters/python_runtime.py) instead of the sandbox image's python3, for
    a harness that needs a newer one (`python = ">=3.12"`)."""

    @field_validator("python")
    @classmethod
    def _python_spec(cls, v: str | None) -> str | None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            return v if v is None else str(SpecifierSet(v)) and v
        except InvalidSpecifier:
            raise ValueError(f"python {v!r} is not a version requirement like \">=3.12\"") from None

    @field_validator("node_runtime")
    @classmethod
    def _exact_node(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+\.\d+\.\d+", v):
            raise ValueError(f"node_runtime {v!r}: want one exact node version, e.g. \"22.23.5\"")
        return v

    @field_validator("mounts")
    @classmethod
    def _mountable(cls, v: list[str]) -> list[str]:
        parse_mounts(v)
        return v


class CommandAdapter:
    """Instances carry their capabilities from the config (class attributes are defaults)."""

    completion = "per config: exit code, a status file, or a stdout pattern"

    def __init__(self, config: CommandConfig | dict[str, Any], source: str | None = None):
        self.config = config if isinstance(config, CommandConfig) else CommandConfig.model_validate(config)
        self.source = source
        """The config file it came from (named in the install hint)."""
        c = self.config
        self.spec: InstallSpec | None = parse_install(c.install)
        self.pip_inside = self.spec is not None and self.spec.kind == "pip" and c.placement == "inside"
        """A pip harness built for the sandbox's python3 (adapters/pip_inside.py)."""
        if (c.python is not None or c.python_runtime is not None) and not self.pip_inside:
            raise ValueError(f"command adapter {c.name!r}: python and python_runtime need install = \"pip:...\" and placement = "
                             "\"inside\" (it is checked against the sandbox's python3)")
        if c.node_runtime is not None and (self.spec is None or self.spec.kind != "npm"):
            raise ValueError(f"command adapter {c.name!r}: node_runtime needs an npm install (it goes in its prefix)")
        if (c.after_install or c.after_install_env) and (self.spec is None or self.pip_inside or not c.after_install):
            raise ValueError(f"command adapter {c.name!r}: after_install needs an npm or beside pip install, and "
                             "after_install_env needs after_install")
        if self.spec is not None and self.spec.kind == "npm" and c.npm_prefix is None:
            self.config = c = c.model_copy(update={"npm_prefix": c.name})
        self.extra_mounts = parse_mounts(c.mounts)
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
            return cls(data, str(p))
        except ValidationError as e:  # one line per field, named, without pydantic's boilerplate
            lines = [f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg'].removeprefix('Value error, ')}"
                     for err in e.errors()]
            raise ValueError(f"{p}: invalid harness config: " + "; ".join(lines)) from None
        except ValueError as e:
            raise ValueError(f"{p}: invalid harness config: {e}") from None

    @property
    def install_dir(self) -> tuple[str, str] | None:
        """(toolchain subfolder, folder name) the config's `install` goes to; None for "none"."""
        if self.spec is None:
            return None
        c = self.config
        return self.spec.subdir_for(c.placement), (c.npm_prefix if self.spec.kind == "npm" else c.venv) or c.name

    @property
    def after(self) -> tuple[list[str], dict[str, str]] | None:
        """`after_install` and its env (templates), or None."""
        return (list(self.config.after_install), dict(self.config.after_install_env)) if self.config.after_install else None

    def install_hint(self) -> str:
        """The command that installs this harness."""
        return f"harnessrl harness install {self.source or '<this config file>'}"

    def check_installed(self, toolchain: Path | None = None) -> None:
        """Raise HarnessNotInstalled (naming `install_hint`) or NodeTooOld unless it can run."""
        where = self.install_dir
        if where is None:
            return
        root, own = toolchain or toolchain_root(), self.config.node_runtime
        if self.pip_inside:
            return self._check_pip_inside(root, where[1])
        require(where[0], where[1], stamp_for(self.spec, own, self.after), root, fix=self.install_hint())
        if self.config.node:
            check_node(self.config.node, own or node_version(root), f"harness {self.name!r} ({self.spec.spec})",
                       "its node_runtime" if own else "the toolchain's")

    def _check_pip_inside(self, root: Path, dirname: str) -> None:
        got = installed_spec("pip", dirname, root) or ""
        version = got.removeprefix(f"{self.spec.spec} for python ")
        own = self.config.python_runtime
        if own is not None and (version != own or installed_spec("python", own, root) is None):
            version = got  # built for another interpreter, or its runtime is gone: reinstall
        if version == got:  # not installed, or another spec: the usual message
            require("pip", dirname, f"{self.spec.spec} for python <the sandbox's>", root, fix=self.install_hint())
        if self.config.python:
            from packaging.specifiers import SpecifierSet

            if version not in SpecifierSet(self.config.python):
                raise HarnessNotInstalled(f"harness {self.name!r} ({self.spec.spec}) needs python "
                                          f"{self.config.python}, but it was installed for the sandbox's python "
                                          f"{version}: see docs/harnesses.md, 'Python harnesses inside'")

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        npm = self.config.npm_prefix if self.spec is not None and self.spec.kind == "npm" else None
        parts = ("node", f"npm/{npm}") if npm else ()  # an npm harness runs from these alone
        own = inside_mounts(endpoint, toolchain, parts) if self.placement == "inside" else []
        return own + list(self.extra_mounts)

    def _vars(self, launch: Launch, inside: bool, scratch: str, **extra: str) -> dict[str, str]:
        ep = launch.endpoint
        base = ep.inside_base_url if inside else ep.base_url
        root = TOOLCHAIN_MOUNT if inside else str(launch.toolchain or toolchain_root())
        where = self.install_dir
        return {"task": launch.problem_statement, "model": ep.model, "api_key": ep.api_key, "base_url": base,
                "openai_base_url": f"{base}/v1", "workdir": launch.sandbox.workdir, "scratch": scratch,
                "max_calls": str(launch.limits.max_calls), "wall_time_s": str(int(launch.limits.wall_time_s)),
                "toolchain": root, "bin": f"{root}/{where[0]}/{where[1]}/bin" if where else "", **extra}

    def _fill(self, template: str, v: dict[str, str]) -> str:
        try:
            return string.Template(template).substitute(v)
        except (KeyError, ValueError) as e:
            raise ValueError(f"command adapter {self.name!r}: template {template!r}: unknown or bad "
                             f"variable {e}; known: {sorted(v)}") from None

    def launch(self, launch: Launch) -> HarnessResult:
        c = self.config
        self.check_installed(launch.toolchain)
        if c.placement == "inside":
            v = self._vars(launch, True, SANDBOX_SCRATCH)
            env = {k: self._fill(t, v) for k, t in c.env.items()}
            if self.pip_inside:
                env.setdefault("PATH", f"{v['bin']}:/usr/local/bin:/usr/bin:/bin")
            elif c.npm_prefix:
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
        client = scratch / "harnessrl-exec"
        shutil.copyfile(EXEC_CLIENT, client)
        client.chmod(0o755)
        sock = str(scratch / "exec.sock")
        v = self._vars(launch, False, str(scratch), exec_socket=sock, bridge_dir=str(scratch), exec_client=str(client))
        for p, t in c.files.items():
            path = Path(self._fill(p, v))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self._fill(t, v))
        env = clean_env({"HARNESSRL_EXEC_SOCKET": sock, "HARNESSRL_EXEC_CWD": launch.sandbox.workdir,
                         **{k: self._fill(t, v) for k, t in c.env.items()}})
        argv = [self._fill(a, v) for a in c.command]
        with ExecBridge(launch.sandbox, sock):
            try:
                run = run_host(argv, env, str(scratch), launch.limits.wall_time_s, launch.cancel,
                               network=c.network, proxy_url=launch.endpoint.base_url)
            except (FileNotFoundError, PermissionError) as e:  # what a shell reports as 127 / 126
                code = 127 if isinstance(e, FileNotFoundError) else 126
                return HarnessResult("harness_exited", code, None, "", f"{argv[0]}: {e.strerror} "
                                     f"(PATH={env.get('PATH', '')})", 0.0)
        status_text = None
        if c.completion.status_file:
            sf = Path(self._fill(c.completion.status_file, v))
            status_text = sf.read_text() if sf.is_file() else None
        result = self._result(run.exit_code, run.timed_out, run.stdout, run.stderr, run.duration_s, status_text)
        result.details["network"] = run.network
        return result

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
