"""A warm pool of sandboxes per (RepoSpec, mounts): episodes get a started, clean repo without waiting.

Contract: `acquire(spec, mounts)` returns a started sandbox at the base commit with nothing left
from earlier episodes (reset on release: tree, untracked files, /tmp, home, processes), made
with those bind mounts; it never hands one sandbox to two holders. `release` resets it and
keeps it warm, or closes it when it died, its reset failed, or its key already holds `size`
sandboxes; it returns the reset's seconds (None: no reset ran). `discard` closes a held one
without reset (an abandoned episode). A dead idle sandbox is closed, never handed out.

`size` counts a key's sandboxes, held or idle: prewarm starts that many, and (with `refill`)
a background thread replaces every one closed since, so in steady state an episode's release
makes the next one's acquire warm and nothing is rebuilt. An acquire that finds none idle waits
for one being started for its key, else creates one itself (past `size`: closed on release).
`resize` changes `size` for every key (filling up, or closing idle surplus); `settle` waits
until nothing is being started (e.g. between two measured runs, so one run's refills do not
load the next).

A key may give its own `make` (how one sandbox is created, e.g. with a private directory
bind-mounted into each) and `on_close` (called after the pool closes one of its sandboxes);
then `mounts` names what the key's sandboxes share. Works with any backend that has
`create(spec, mounts=..., start=True)`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Hashable, Sequence

from pydantic import BaseModel, Field

from harnessrl.sandboxes.base import RepoSpec, Sandbox, SandboxError

log = logging.getLogger(__name__)
Key = tuple[RepoSpec, Hashable]


class PoolConfig(BaseModel):
    """How many sandboxes stay warm."""

    size: int = Field(default=2, ge=0)
    """Sandboxes kept per (RepoSpec, mounts), held by episodes or idle and started."""
    refill_workers: int = Field(default=2, ge=1)
    """Threads creating replacement sandboxes in the background."""
    refill: bool = True
    """Replace closed sandboxes in the background (False: only prewarm and release fill it)."""


def mount_key(mounts: Sequence[Any]) -> tuple:
    """Mounts as a hashable key: (host, target, read_only) per Mount-like object or tuple."""
    return tuple((str(m.host), str(m.target), bool(m.read_only)) if hasattr(m, "host")
                 else (str(m[0]), str(m[1]), bool(m[2])) for m in mounts)


class SandboxPool:
    """Warm sandboxes per (RepoSpec, mounts) on top of one backend. Use as a context manager."""

    def __init__(self, backend: Any, config: PoolConfig | None = None):
        self.backend, self.config = backend, config or PoolConfig()
        self._idle: dict[Key, list[Sandbox]] = defaultdict(list)
        self._pending: dict[Key, int] = defaultdict(int)
        self._held: dict[Key, int] = defaultdict(int)
        self._owner: dict[int, tuple[Key, Sandbox]] = {}
        self._makers: dict[Key, tuple[Callable[[], Sandbox], Callable[[Sandbox], None] | None]] = {}
        self._cond = threading.Condition()
        self._refill = ThreadPoolExecutor(self.config.refill_workers, thread_name_prefix="sandbox-pool")
        self._closed = False

    # -- keys ----------------------------------------------------------------------------------
    def _key(self, spec: RepoSpec, mounts: Sequence[Any], make: Callable[[], Sandbox] | None,
             on_close: Callable[[Sandbox], None] | None) -> Key:
        key = (spec, mount_key(mounts))
        with self._cond:
            if key not in self._makers:
                fixed = list(mounts)
                self._makers[key] = (make or (lambda: self.backend.create(spec, mounts=fixed)), on_close)
        return key

    def _close(self, key: Key, sb: Sandbox) -> None:
        try:
            sb.close()
        finally:
            on_close = self._makers.get(key, (None, None))[1]
            if on_close is not None:
                on_close(sb)

    # -- the API ---------------------------------------------------------------------------------
    def prewarm(self, spec: RepoSpec, mounts: Sequence[Any] = (), wait: bool = True, *,
                make: Callable[[], Sandbox] | None = None, on_close: Callable[[Sandbox], None] | None = None) -> None:
        """Start sandboxes for the key until it holds `size` (blocking unless wait=False)."""
        futures = self._schedule(self._key(spec, mounts, make, on_close))
        if wait:
            for f in futures:
                f.result()

    def acquire(self, spec: RepoSpec, mounts: Sequence[Any] = (), *, make: Callable[[], Sandbox] | None = None,
                on_close: Callable[[Sandbox], None] | None = None) -> Sandbox:
        key = self._key(spec, mounts, make, on_close)
        while True:
            with self._cond:
                sb = None
                while not self._idle[key] and self._pending[key] and not self._closed:
                    self._cond.wait(1.0)  # one being started for this key lands soon
                if self._idle[key]:
                    sb = self._idle[key].pop()
                self._held[key] += 1  # counted before a create below, so refills do not overshoot
            # Asked outside the lock: a backend's liveness check is a round trip (Docker's
            # inspect), and sixty episodes starting at once must not queue behind each other's.
            if sb is None or sb.alive():
                break
            with self._cond:
                self._held[key] -= 1
            self._close(key, sb)  # died while idle: never handed out
        if sb is None:
            try:
                sb = self._makers[key][0]()
            except BaseException:
                with self._cond:
                    self._held[key] -= 1
                raise
        with self._cond:
            self._owner[id(sb)] = (key, sb)
        if self.config.refill:  # a new key grows to `size`; a dead one found is replaced
            self._schedule(key)
        return sb

    def release(self, sb: Sandbox) -> float | None:
        """Reset and keep warm; dead, unresettable or surplus sandboxes are closed. Returns the
        seconds the reset took (None when none ran)."""
        with self._cond:
            owned = self._owner.pop(id(sb), None)
            if owned is None and any(sb is s for lst in self._idle.values() for s in lst):
                return None  # released twice: it is idle already, never close it under a new holder
        if owned is None:
            sb.close()
            return None
        key = owned[0]
        if self._closed or not sb.alive():
            self._drop(key, sb)
            return None
        t0 = time.monotonic()
        try:
            sb.reset()
        except SandboxError as e:
            log.info("closing sandbox %r: its reset failed: %s", sb, e)
            self._drop(key, sb)
            return time.monotonic() - t0
        reset_s = time.monotonic() - t0
        with self._cond:
            self._held[key] -= 1
            if not self._closed and self._count(key) < self.config.size:
                self._idle[key].append(sb)
                self._cond.notify_all()
                return reset_s
        self._close(key, sb)
        return reset_s

    def discard(self, sb: Sandbox) -> None:
        """Close a held sandbox without reset (never handed out again); a refill replaces it."""
        with self._cond:
            owned = self._owner.pop(id(sb), None)
        if owned is None:
            sb.close()
            return
        self._drop(owned[0], sb)

    def resize(self, size: int) -> None:
        """Keep `size` sandboxes per key from now on: every key seen so far is filled up to it in
        the background, or its idle surplus closed (held ones close when released)."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        surplus = []
        with self._cond:
            self.config = self.config.model_copy(update={"size": size})
            keys = list(self._makers)
            for key in keys:
                while self._idle[key] and self._count(key) > size:
                    surplus.append((key, self._idle[key].pop(0)))
        for key, sb in surplus:
            self._close(key, sb)
        for key in keys:
            self._schedule(key)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until no sandbox is being started (prewarms and refills landed); False when
        `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while any(self._pending.values()) and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(1.0 if left is None else min(1.0, left))
        return True

    def idle(self, spec: RepoSpec, mounts: Sequence[Any] = ()) -> int:
        with self._cond:
            return len(self._idle[(spec, mount_key(mounts))])

    def _drop(self, key: Key, sb: Sandbox) -> None:
        with self._cond:
            self._held[key] -= 1
        try:
            self._close(key, sb)
        finally:
            if self.config.refill:
                self._schedule(key)

    # -- filling ---------------------------------------------------------------------------------
    def _count(self, key: Key) -> int:
        return len(self._idle[key]) + self._pending[key] + self._held[key]

    def _schedule(self, key: Key) -> list:
        with self._cond:
            if self._closed:
                return []
            need = max(self.config.size - self._count(key), 0)
            self._pending[key] += need
        return [self._refill.submit(self._add, key) for _ in range(need)]

    def _add(self, key: Key) -> None:
        try:
            sb = self._makers[key][0]()
        except Exception as e:  # the next acquire creates synchronously and raises it
            log.warning("pool could not create a sandbox for %s: %s", key[0].repo_id, e)
            with self._cond:
                self._pending[key] -= 1
                self._cond.notify_all()
            return
        with self._cond:
            self._pending[key] -= 1
            self._cond.notify_all()
            if not self._closed and len(self._idle[key]) + self._held[key] < self.config.size:
                self._idle[key].append(sb)
                return
        self._close(key, sb)

    def close(self) -> None:
        """Close every idle sandbox and stop refilling; held ones are closed when released."""
        with self._cond:
            self._closed = True
            idle = [(k, sb) for k, lst in self._idle.items() for sb in lst]
            self._idle.clear()
            self._cond.notify_all()
        self._refill.shutdown(wait=True)
        for key, sb in idle:
            try:
                self._close(key, sb)
            except Exception as e:  # noqa: BLE001 - one failed close must not keep the others
                log.warning("closing idle sandbox %r: %s", sb, e)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
