"""The Sandbox contract: one episode's copy of a repository, isolated, resettable.

Backends (`docker`, `local`) satisfy this Protocol without inheriting from it. Files and
patches cross the boundary as bytes (tar streams or files), never on a command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class ExecResult:
    """What one command in the sandbox did."""

    exit_code: int
    """Process exit status; -1 when it was killed for its timeout."""
    output: str
    """stdout and stderr interleaved, decoded as UTF-8 with replacement."""
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass(frozen=True)
class RepoSpec:
    """Which repository a sandbox holds: a source on the host checked out at one commit."""

    repo_id: str
    """Short name used in image tags and cache keys ([a-z0-9_.-])."""
    source: str
    """Host path to a git repository, a git bundle file, or a .tar/.tar.gz archive of a git repo."""
    base_commit: str
    """Commit (sha or ref resolvable in `source`) the workspace starts at and resets to."""
    setup_commands: tuple[str, ...] = ()
    """Shell commands run once, offline, when the image / cached checkout is built."""
    workdir: str = "/workspace/repo"
    """Absolute path of the repository inside the sandbox."""
    image: str | None = None
    """A Docker image of the task's own (SWE-Gym / R2E-Gym / SWE-rebench `image_name`) to build
    the sandbox on instead of the base image; it must be present locally (nothing is pulled)."""
    image_context: str | None = None
    """A Docker build context (a folder with a Dockerfile, e.g. a Harbor task's environment/)
    that `image` is built from, offline, when missing; `source` is then exported from that
    image's `workdir` (sandboxes.context_image)."""
    cpus: float | None = None
    """This task's CPU quota (cores); None: the backend's."""
    memory_mb: int | None = None
    """This task's memory limit in MiB; None: the backend's."""
    storage_mb: int | None = None
    """This task's disk budget in MiB; docker enforces it as the largest file (RLIMIT_FSIZE)."""

    def __post_init__(self) -> None:
        for name in ("repo_id", "source", "base_commit"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"RepoSpec.{name} must be a non-empty string, got {getattr(self, name)!r}")
        if isinstance(self.setup_commands, str) or not all(isinstance(c, str) for c in self.setup_commands):
            raise ValueError(f"RepoSpec.setup_commands must be a sequence of strings, got {self.setup_commands!r}")
        object.__setattr__(self, "setup_commands", tuple(self.setup_commands))  # hashable
        if not self.workdir.startswith("/") or self.workdir.rstrip("/") in ("", "/tmp", "/home/agent"):
            raise ValueError(f"RepoSpec.workdir must be an absolute path of its own, got {self.workdir!r}")


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed (not the agent's command)."""


class SandboxDied(SandboxError):
    """The sandbox is gone (container killed, process tree vanished)."""


class SandboxUnavailable(SandboxError):
    """No backend can run here; the message says how to fix that."""


@runtime_checkable
class Sandbox(Protocol):
    """One repository checkout at its base commit, in isolation."""

    workdir: str
    """Absolute path of the repository inside the sandbox."""

    def start(self) -> None: ...

    def exec(self, command: str | list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        """Run a command as the sandbox's unprivileged user (uid 1000). A string runs under
        `bash -c` (not a login shell, so a PATH passed in `env` wins); a list runs as argv."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def diff(self) -> str:
        """The agent's changes against the base commit as a git patch, new files included."""
        ...

    def reset(self) -> None:
        """Back to the base commit, untracked files removed; fast (warm pools rely on it)."""
        ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...


class Closable(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class Tunnels(Protocol):
    """An optional capability of a sandbox (Docker's): reach a host address from inside with
    no network, socket or host path in the sandbox, over the backend's own control stream."""

    def tunnel(self, listen: str, target: str) -> Closable:
        """Listen on `listen` in the sandbox (tcp:127.0.0.1:PORT or unix:PATH); connect each
        connection to `target` (tcp:HOST:PORT or unix:PATH) on the host, bytes verbatim both
        ways, until the returned handle is closed."""
        ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Makes sandboxes for RepoSpecs (`docker`, `local`; see make_backend)."""

    name: str

    def create(self, spec: RepoSpec, mounts: Sequence[Any] = (), env: dict[str, str] | None = None,
               start: bool = True) -> Sandbox:
        """A sandbox at `spec`'s base commit. `mounts`: extra bind mounts, each a
        (host_path, sandbox_path, read_only) tuple or an object with host/target/read_only
        attributes (e.g. a unix-socket dir, a read-only toolchain); an object whose `socket`
        attribute is true is a directory of host sockets, which a backend whose sandboxes
        tunnel (`Tunnels`) leaves unmounted; `env`: variables every command sees."""
        ...

    def reap(self, older_than_s: float = 0.0, run_id: str | None = None) -> int:
        """Remove sandboxes a crashed run left behind; return how many."""
        ...
