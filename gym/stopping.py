"""Stopping a run by a signal: SIGTERM (a job scheduler's stop, `kill`, `docker stop`) and
Ctrl-C end `harnessrl train` and `rollout` (and benches that hold sandboxes and an engine) by
cancelling the run's coroutine, so every `finally` on the way out runs; `Stopped` says how it
ended (exit status 143 for SIGTERM, 130 for Ctrl-C)."""
from __future__ import annotations

import sys


class Stopped(Exception):
    """The run was asked to stop (SIGTERM or Ctrl-C) and has unwound."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how, self.status = how, 143 if how == "SIGTERM" else 130


class Stop:
    """SIGTERM (a job scheduler's stop, `kill`, `docker stop`) and Ctrl-C for `train` and `rollout`
    (public: a bench that holds sandboxes and an engine takes signals the same way).

    Before the run's coroutine starts nothing is held (no sandbox, no engine of ours outside
    this process): the process leaves at once, exit status 143 (130 for Ctrl-C). Raising
    KeyboardInterrupt there instead, as Python's default does, lands inside whatever import is
    under way; libraries that catch it broadly (transformers' lazy imports, numpy's) turned it
    into an ImportError, exit status 1, or swallowed it and the run went on. Once the
    coroutine runs, the first signal cancels it, so every `finally` on the way out runs (the
    warm pool's containers are removed, the engine stops); a cancellation that lands while the
    engine and trainer load is delivered at the next await. A second SIGTERM is ignored (the
    shut-down is under way); a second Ctrl-C stops at once. A run that returns although it was
    asked to stop still ends 143/130, never 0."""

    def __init__(self, cmd: str):
        import signal

        self.cmd, self.how = cmd, None
        self._loop = self._task = None
        self._before = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore(self) -> None:
        """The handlers from before (the command has returned: e.g. `main` called in a test)."""
        import signal

        for sig, handler in self._before.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        import os
        import signal

        how = "SIGTERM" if signum == signal.SIGTERM else "interrupt"
        if self._task is None:
            print(f"harnessrl {self.cmd}: stopped by {how} before the run started (nothing to shut down)",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(143 if how == "SIGTERM" else 130)
        if self.how is None:
            self.how = how
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:  # the loop has closed: the run is over, `run` reports the stop
                pass
        elif how == "interrupt":
            raise KeyboardInterrupt

    def run(self, coro):
        """`asyncio.run(coro)`, its main task cancelled by the first signal; `Stopped` when one came."""
        import asyncio

        async def main():
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            return await coro

        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if self.how is None:
                raise
            raise Stopped(self.how) from None
        finally:
            self._task = None  # the run's resources are released: a later signal leaves at once
        if self.how is not None:
            raise Stopped(self.how)
        return result
