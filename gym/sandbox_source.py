"""Warm sandboxes for real episodes: a pool whose sandboxes each own a socket dir, leased per episode.

Contract: `PooledSandboxes.lease(spec, adapter, toolchain)` hands an episode a `SandboxLease`:
a started sandbox at the spec's base commit, exactly as clean as a fresh one, made with the
adapter's mounts; an inside harness's sandbox also has a host socket directory of its own,
bind-mounted at SOCKET_MOUNT once for the sandbox's whole life. The episode puts its relay (the
socket reaching the proxy) there and takes it away at its end, so between episodes no socket
exists; the session id and key are new every episode. The pool is keyed by (spec, the adapter's
mounts with that per-sandbox directory as a placeholder): every episode of one (repo, harness)
pair shares a key, and `mounts(endpoint, toolchain)` is asked with an endpoint that carries the
socket dir only (a pooled sandbox outlives any one session).

The episode gets a revocable view of the sandbox, never the sandbox itself. `lease.release()`
revokes the view first (a late call from a thread of the ended episode, e.g. a beside harness's
exec bridge, raises SandboxDied and never reaches the next holder), waits for calls in flight
(if any remain, they are killed by a reset first), empties the socket dir, then the pool resets
the sandbox (every process killed; tree, untracked files, /tmp, home back to base) and keeps it,
or closes it when it died, its reset failed or its key is full. `lease.discard()` closes it
(a cancelled episode). Each lease records `acquire_s` (including any wait for a sandbox being
started) and `reset_s`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from harnessrl.adapters.base import Endpoint, HarnessAdapter, Mount
from harnessrl.sandboxes.base import ExecResult, RepoSpec, Sandbox, SandboxDied, Tunnels
from harnessrl.sandboxes.pool import PoolConfig, SandboxPool

#: Stands for a sandbox's own socket dir in the mounts its pool is keyed by.
SOCKET_PLACEHOLDER = "<per-sandbox socket dir>"
#: How long a release waits for the ended episode's calls in flight to return.
DRAIN_S = 30.0


class SandboxView:
    """One episode's handle on a pooled sandbox: the Sandbox protocol, until revoked."""

    def __init__(self, sandbox: Sandbox):
        self.backing = sandbox
        """The backend's sandbox (tests and diagnostics; calls on it are not revoked)."""
        self.workdir = sandbox.workdir
        self.id = getattr(sandbox, "id", None)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._revoked = False
        if isinstance(sandbox, Tunnels):  # the capability only where the backing sandbox has it
            self.tunnel = lambda listen, target: self._call("tunnel", listen, target)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._cond:
            if self._revoked:
                raise SandboxDied(f"{self.backing!r}: this episode's lease on the sandbox has ended")
            self._in_flight += 1
        try:
            return getattr(self.backing, name)(*args, **kwargs)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def start(self) -> None:  # a leased sandbox is started already
        pass

    def exec(self, command: str | list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        return self._call("exec", command, timeout=timeout, env=env, workdir=workdir)

    def read_file(self, path: str) -> bytes:
        return self._call("read_file", path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._call("write_file", path, data, mode)

    def diff(self) -> str:
        return self._call("diff")

    def reset(self) -> None:
        self._call("reset")

    def alive(self) -> bool:
        return not self._revoked and self.backing.alive()

    def close(self) -> None:
        """Ends this view only; the lease decides the sandbox's fate."""
        self.revoke(0)

    def revoke(self, drain_s: float) -> bool:
        """No new call passes; True once none is in flight (waiting up to drain_s)."""
        with self._cond:
            self._revoked = True
            return self._cond.wait_for(lambda: self._in_flight == 0, drain_s)

    def __repr__(self) -> str:
        return f"SandboxView({self.backing!r})"


@dataclass
class SandboxLease:
    """One episode's sandbox from a pool; release or discard it exactly once."""

    sandbox: SandboxView
    socket_dir: Path | None
    """Host dir mounted at SOCKET_MOUNT in this sandbox (None: a beside harness's)."""
    acquire_s: float
    source: "PooledSandboxes"
    reset_s: float | None = None
    _done: bool = field(default=False, repr=False)

    def release(self) -> float | None:
        """Back to the pool, reset (see the module docstring); returns the reset's seconds."""
        if self._done:
            return self.reset_s
        self._done = True
        sb, pool = self.sandbox.backing, self.source.pool
        if not self.sandbox.revoke(0):  # a call of the ended episode still runs: kill it, wait
            try:
                sb.reset()
            except Exception:  # noqa: BLE001 - the pool's own reset below decides
                pass
            if not self.sandbox.revoke(DRAIN_S):
                pool.discard(sb)
                return None
        try:
            _empty(self.socket_dir)
        except OSError:
            pool.discard(sb)
            return None
        self.reset_s = pool.release(sb)
        if self.reset_s is not None:
            self.source._record(reset_s=self.reset_s)
        return self.reset_s

    def discard(self) -> None:
        """Close it without reset (abandoned episode); never handed out again."""
        if self._done:
            return
        self._done = True
        self.sandbox.revoke(0)
        self.source.pool.discard(self.sandbox.backing)


@runtime_checkable
class SandboxSource(Protocol):
    """Where `run_episode` gets a sandbox when it is handed one instead of a factory."""

    def lease(self, spec: RepoSpec, adapter: HarnessAdapter, toolchain: Path | None = None) -> SandboxLease: ...


class PooledSandboxes:
    """A `SandboxSource` of warm sandboxes on one backend. Use as a context manager."""

    def __init__(self, backend: Any, size: int = 2, refill_workers: int = 2, root: str | None = None):
        self.pool = SandboxPool(backend, PoolConfig(size=size, refill_workers=refill_workers))
        self.root = Path(tempfile.mkdtemp(prefix="harnessrl-sockets-", dir=root))
        self._dirs: dict[int, Path] = {}
        self._lock = threading.Lock()
        self.acquire_s: list[float] = []
        self.reset_s: list[float] = []

    def _shared_mounts(self, adapter: HarnessAdapter, toolchain: Path | None) -> tuple[bool, list[Mount]]:
        inside = adapter.placement == "inside"
        probe = Endpoint("", "", "", SOCKET_PLACEHOLDER if inside else None)
        return inside, list(adapter.mounts(probe, toolchain))

    def _maker(self, spec: RepoSpec, inside: bool, shared: Sequence[Mount]):
        def make() -> Sandbox:
            d = Path(tempfile.mkdtemp(prefix="sb-", dir=self.root)) if inside else None
            if d is not None:
                os.chmod(d, 0o755)  # the sandbox user reaches the socket, never writes the dir
            mounts = [replace(m, host=str(d)) if m.host == SOCKET_PLACEHOLDER else m for m in shared]
            try:
                sb = self.pool.backend.create(spec, mounts=mounts)
            except BaseException:
                if d is not None:
                    shutil.rmtree(d, ignore_errors=True)
                raise
            with self._lock:
                self._dirs[id(sb)] = d
            return sb
        return make

    def _closed(self, sb: Sandbox) -> None:
        with self._lock:
            d = self._dirs.pop(id(sb), None)
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)

    def prewarm(self, spec: RepoSpec, adapter: HarnessAdapter, toolchain: Path | None = None,
                wait: bool = False) -> None:
        """Start the (spec, harness) pair's sandboxes ahead of its first episode."""
        inside, shared = self._shared_mounts(adapter, toolchain)
        self.pool.prewarm(spec, shared, wait, make=self._maker(spec, inside, shared), on_close=self._closed)

    def lease(self, spec: RepoSpec, adapter: HarnessAdapter, toolchain: Path | None = None) -> SandboxLease:
        inside, shared = self._shared_mounts(adapter, toolchain)
        t0 = time.monotonic()
        sb = self.pool.acquire(spec, shared, make=self._maker(spec, inside, shared), on_close=self._closed)
        took = time.monotonic() - t0
        self._record(acquire_s=took)
        with self._lock:
            d = self._dirs.get(id(sb))
        return SandboxLease(SandboxView(sb), d, took, self)

    def _record(self, acquire_s: float | None = None, reset_s: float | None = None) -> None:
        with self._lock:
            if acquire_s is not None:
                self.acquire_s.append(acquire_s)
            if reset_s is not None:
                self.reset_s.append(reset_s)

    def close(self) -> None:
        """Idle sandboxes closed, socket dirs removed; held ones close when released. Idempotent."""
        atexit.unregister(self.close)  # when a creator registered it (rollout.prewarmed_sandboxes)
        self.pool.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PooledSandboxes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty(d: Path | None) -> None:
    """Remove what is in a socket dir (the dir itself stays: it is bind-mounted)."""
    if d is None:
        return
    for p in d.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
