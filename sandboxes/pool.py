"""A warm pool of sandboxes per RepoSpec: episodes get a started, clean repo without waiting.

Contract: `acquire(spec)` returns a started sandbox at the base commit with nothing left from
earlier episodes (reset on release: tree, untracked files, /tmp, home, processes); `release`
resets it and keeps it warm, or closes it when it is broken or the pool is full. A background
thread tops each spec's idle list back up to `size` after every acquire. Works with any
backend that has `create(spec, start=True)`.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, Field

from harnessrl.sandboxes.base import RepoSpec, Sandbox, SandboxError

log = logging.getLogger(__name__)


class PoolConfig(BaseModel):
    """How many sandboxes stay warm."""

    size: int = Field(default=2, ge=0)
    """Idle, started sandboxes kept per RepoSpec."""
    refill_workers: int = Field(default=2, ge=1)
    """Threads creating replacement sandboxes in the background."""
    refill: bool = True
    """Top the idle list up in the background after each acquire (False: only prewarm and
    release fill it)."""


class SandboxPool:
    """Warm sandboxes per RepoSpec on top of one backend. Use as a context manager."""

    def __init__(self, backend: Any, config: PoolConfig | None = None):
        self.backend, self.config = backend, config or PoolConfig()
        self._idle: dict[RepoSpec, list[Sandbox]] = defaultdict(list)
        self._pending: dict[RepoSpec, int] = defaultdict(int)
        self._owner: dict[int, RepoSpec] = {}
        self._lock = threading.Lock()
        self._refill = ThreadPoolExecutor(self.config.refill_workers, thread_name_prefix="sandbox-pool")
        self._closed = False

    def prewarm(self, spec: RepoSpec, wait: bool = True) -> None:
        """Fill `spec`'s idle list up to `size` (blocking unless wait=False)."""
        futures = self._schedule(spec)
        if wait:
            for f in futures:
                f.result()

    def acquire(self, spec: RepoSpec) -> Sandbox:
        sb = None
        with self._lock:
            while self._idle[spec] and sb is None:
                cand = self._idle[spec].pop()
                if cand.alive():
                    sb = cand
                else:
                    cand.close()
        if sb is None:
            sb = self.backend.create(spec)
        with self._lock:
            self._owner[id(sb)] = spec
        if self.config.refill:
            self._schedule(spec)
        return sb

    def release(self, sb: Sandbox) -> None:
        """Reset and keep warm; broken or surplus sandboxes are closed."""
        with self._lock:
            spec = self._owner.pop(id(sb), None)
        if spec is None or self._closed:
            sb.close()
            return
        try:
            if not sb.alive():
                raise SandboxError("not alive")
            sb.reset()
        except SandboxError as e:
            log.info("closing broken sandbox %r on release: %s", sb, e)
            sb.close()
            self._schedule(spec)
            return
        with self._lock:
            if len(self._idle[spec]) < self.config.size:
                self._idle[spec].append(sb)
                return
        sb.close()

    def idle(self, spec: RepoSpec) -> int:
        with self._lock:
            return len(self._idle[spec])

    def _schedule(self, spec: RepoSpec) -> list:
        with self._lock:
            if self._closed:
                return []
            need = self.config.size - len(self._idle[spec]) - self._pending[spec]
            self._pending[spec] += max(need, 0)
        return [self._refill.submit(self._add, spec) for _ in range(max(need, 0))]

    def _add(self, spec: RepoSpec) -> None:
        try:
            sb = self.backend.create(spec)
        except Exception as e:  # the next acquire creates synchronously and raises it
            log.warning("pool could not create a sandbox for %s: %s", spec.repo_id, e)
            with self._lock:
                self._pending[spec] -= 1
            return
        with self._lock:
            self._pending[spec] -= 1
            if not self._closed and len(self._idle[spec]) < self.config.size:
                self._idle[spec].append(sb)
                return
        sb.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [sb for lst in self._idle.values() for sb in lst]
            self._idle.clear()
        self._refill.shutdown(wait=True)
        for sb in idle:
            sb.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
