"""The HarnessAdapter contract: run one real, unmodified agent harness on one task to its end.

An adapter is handed plain data (a `Launch`: the proxy endpoint and key, the model name, the
problem statement, the episode's `Sandbox`, the limits and a scratch dir on the host) and runs
the harness to completion, returning a `HarnessResult` whose `reason` says why it stopped. It
reaches the model only through the endpoint it is handed; it never sees hidden tests or the
reward (those are applied by the episode runner after `launch` returns).

Two placements:
- "inside": the harness binary runs in the sandbox (the toolchain read-only at
  `TOOLCHAIN_MOUNT`: bound, or copied to a remote engine). The sandbox has no network; the
  harness reaches the proxy on the container's own 127.0.0.1: through a tunnel over the
  sandbox's control stream where the sandbox has one (`sandboxes.base.Tunnels`, Docker), else
  through the relay (adapters/relay.py), which forwards to a per-episode unix socket
  bind-mounted at `SOCKET_MOUNT`. `Endpoint.inside_base_url` is what it is given.
- "beside": the harness runs on the host (its own venv in the toolchain) and talks to the
  proxy over loopback TCP; its actions are carried out in the sandbox (mini-swe-agent runs its
  commands through `Sandbox.exec`; aider edits a host checkout synced into the sandbox).

Adapters satisfy `HarnessAdapter` structurally; they do not inherit from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Protocol, runtime_checkable

from harnessrl.adapters.cancel import Cancel
from harnessrl.registry import Dialect
from harnessrl.sandboxes.base import Sandbox

Placement = Literal["inside", "beside"]

#: Why a harness run ended. The episode runner adds sandbox_died / engine_error itself.
REASONS = ("submitted", "harness_exited", "call_limit", "timeout", "harness_crashed")

#: Where the toolchain (node + npm prefixes) is mounted read-only inside a sandbox.
# Not under /opt/harnessrl: sandbox backends bind their own read-only data there.
TOOLCHAIN_MOUNT = "/opt/harnessrl-toolchain"
#: Where the per-episode directory holding the proxy's unix socket is mounted inside a sandbox.
SOCKET_MOUNT = "/run/harnessrl"
#: The socket's file name inside that directory (host and sandbox alike).
SOCKET_NAME = "proxy.sock"
#: Port the in-sandbox relay listens on (the container's own loopback; no network exists).
RELAY_PORT = 18080
#: Scratch dir inside the sandbox for harness homes/configs (the root fs is read-only).
SANDBOX_SCRATCH = "/tmp/harnessrl"


@dataclass(frozen=True)
class Mount:
    """A bind mount an inside harness needs in its sandbox (the sandbox backend applies it)."""

    host: str
    target: str
    read_only: bool = True
    socket: bool = False
    """A directory of host unix sockets (the proxy's): a backend whose sandboxes tunnel
    (`sandboxes.base.Tunnels`) leaves it unmounted, and the harness is tunnelled instead."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach this episode's proxy session: plain data, nothing else."""

    base_url: str
    """Host-side session base URL without `/v1`, e.g. http://127.0.0.1:8000/s/<sid>. OpenAI
    dialects append `/v1`; Anthropic clients take it as is."""
    api_key: str
    """The session's secret key."""
    model: str
    """Model name the harness asks for."""
    socket_dir: str | None = None
    """Host directory holding `proxy.sock`, a unix socket reaching the proxy (for inside
    harnesses; mounted at SOCKET_MOUNT). None: the harness must run beside."""

    @property
    def path(self) -> str:
        """The URL path part of base_url (`/s/<sid>`), kept when relayed inside the sandbox."""
        rest = self.base_url.split("://", 1)[-1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else ""

    @property
    def inside_base_url(self) -> str:
        """The same session as seen from inside the sandbox, through the relay."""
        return f"http://127.0.0.1:{RELAY_PORT}{self.path}".rstrip("/")


@dataclass(frozen=True)
class Limits:
    """Budgets for one run. The proxy enforces calls/tokens; the adapter enforces wall time and
    passes max_calls to the harness's own step limit where it has one."""

    max_calls: int = 30
    max_tokens: int | None = None
    """Total completion tokens for the episode (enforced by the proxy session), None = unbounded."""
    wall_time_s: float = 600.0


@dataclass(frozen=True)
class Launch:
    """Everything one harness run gets."""

    endpoint: Endpoint
    problem_statement: str
    sandbox: Sandbox
    limits: Limits
    scratch_dir: Path
    """A private host directory for this run (configs, trajectory files, a beside checkout)."""
    toolchain: Path | None = None
    """Host toolchain root (None: harnessrl.adapters.toolchain.toolchain_root())."""
    cancel: Cancel | None = None
    """Set when the episode is abandoned: a beside harness registers the kill of its process
    tree on it (`run_host(..., cancel=launch.cancel)`); an inside one dies with its sandbox,
    which the episode runner closes on it."""


@dataclass
class HarnessResult:
    """How a harness run ended."""

    reason: str
    """One of REASONS."""
    exit_code: int | None
    """The harness process's exit status (None: killed/never started)."""
    harness_status: str | None = None
    """The harness's own account of its end, e.g. mini-swe-agent's `info.exit_status`
    ("Submitted", "LimitsExceeded") or Claude Code's result `subtype`."""
    stdout_tail: str = ""
    stderr_tail: str = ""
    duration_s: float = 0.0
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"HarnessResult.reason {self.reason!r} not one of {REASONS}")

    def account(self, chars: int = 800) -> str:
        """Its exit code and the end of its stderr (else stdout), for a failure message:
        e.g. `exit 127; stderr: ...timeout: failed to run command 'node': No such file or directory`."""
        code = "killed" if self.exit_code is None else f"exit {self.exit_code}"
        for name, text in (("stderr", self.stderr_tail), ("stdout", self.stdout_tail)):
            text = text.strip()
            if text:
                return f"{code}; {name}: {'…' if len(text) > chars else ''}{text[-chars:]}"
        return f"{code}; no output"


@runtime_checkable
class HarnessAdapter(Protocol):
    """One real agent harness, run unmodified. Optional, outside the protocol: `warm(toolchain=
    None)`, which `Rollout` calls when it starts, to begin slow set-up ahead of the first
    episode (the beside Python harnesses start their fork server, adapters/prefork.py)."""

    name: ClassVar[str]
    """Registry name (e.g. "codex")."""
    dialect: ClassVar[Dialect]
    """The API it speaks to the model, a name in `harnessrl.registry.DIALECTS`: "openai-chat"
    (Chat Completions), "openai-responses" (Responses API), "anthropic" (Messages) or "gemini"
    (generateContent)."""
    placement: ClassVar[Placement]
    """"inside": the binary runs in the sandbox; "beside": it runs on the host and acts on the
    sandbox through the Sandbox protocol."""
    streams: ClassVar[bool]
    """Whether it requests streamed responses by default."""
    completion: ClassVar[str]
    """How it signals that it is done and how its exit is read (prose, for humans and reports)."""
    version: ClassVar[str]
    """The pinned harness version this adapter is tested with."""
    install: ClassVar[str]
    """How the toolchain installs it: "npm:<spec>", "pip:<spec>" or "none" (user-provided)."""

    def mounts(self, endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
        """Bind mounts its sandbox needs, asked before the sandbox is created (empty for beside
        harnesses)."""
        ...

    def launch(self, launch: Launch) -> HarnessResult:
        """Run the harness to its end within launch.limits.wall_time_s; never raises for a
        harness failure (that is a HarnessResult with reason harness_crashed)."""
        ...


def tail(text: str | bytes | None, n: int = 4000) -> str:
    """The last n characters of a process stream, decoded leniently."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text[-n:]


def classify_exit(exit_code: int | None, timed_out: bool) -> str:
    """The reason for a harness whose normal finish is exit 0 (it declared the task done):
    0 -> submitted; another small status -> harness_exited (it stopped on an error it
    reported, e.g. max turns or a refused call); killed or a signal status -> harness_crashed."""
    if timed_out:
        return "timeout"
    if exit_code == 0:
        return "submitted"
    if exit_code is None or exit_code < 0 or exit_code >= 128:
        return "harness_crashed"
    return "harness_exited"
