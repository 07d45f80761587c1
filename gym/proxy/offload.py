"""CPU work the proxy must not do on its event loop: rendering and tokenizing prompts,
decoding and parsing large bodies, building trajectory exports.

Contract: `await offload(fn, *args, heavy=...)` runs `fn` in a worker thread and returns
its result (or raises its exception). Two lanes: ordinary calls share a few workers; heavy
ones (bodies over `HEAVY_BYTES`) queue for their own worker, which only gets CPU time
nothing else wants (Linux SCHED_IDLE on the thread, else a nice value). So one huge
request that tokenizes for seconds neither waits in front of the other sessions' renders
nor takes the CPU from the loop, and their calls keep flowing. The tokenizer releases the
GIL while it encodes (`render._ids`), which is what lets the loop run meanwhile at all.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

OFF_LOOP_BYTES = 256 * 1024
"""Bodies larger than this are decoded and parsed in a worker thread, not on the loop."""

HEAVY_BYTES = 2 * 1024 * 1024
"""Requests with bodies larger than this take the heavy lane (a long agent session's whole
history is well under it; a body this large is an outlier, which may wait for idle CPU)."""

WORKERS = 4
"""Worker threads of the ordinary lane (a render is one thread's work)."""

HEAVY_WORKERS = 1
"""Worker threads of the heavy lane: huge requests are rare, one at a time is enough."""

NICE = 10
"""Where SCHED_IDLE is not available: how much lower the heavy lane's CPU priority is."""

_pools: dict[bool, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _lower_priority() -> None:
    """Linux: SCHED_IDLE for this thread only (it runs when no other thread wants the CPU, and
    yields at once when one does); else a higher nice value. Best effort."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:  # PRIO_PROCESS with a thread id changes only that thread
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE))
    except (AttributeError, OSError):
        pass


def pool(heavy: bool) -> ThreadPoolExecutor:
    with _lock:
        if heavy not in _pools:
            _pools[heavy] = (ThreadPoolExecutor(HEAVY_WORKERS, "harnessrl-proxy-heavy", initializer=_lower_priority)
                             if heavy else ThreadPoolExecutor(WORKERS, "harnessrl-proxy-cpu"))
        return _pools[heavy]


async def offload(fn: Callable[..., T], *args: Any, heavy: bool = False) -> T:
    """`fn(*args)` in a worker thread of the chosen lane, awaited without blocking the loop."""
    return await asyncio.get_running_loop().run_in_executor(pool(heavy), fn, *args)
