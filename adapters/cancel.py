"""`Cancel`: the one-way signal that an episode is abandoned (scheduler timeout or shutdown).

Contract: whoever holds a resource an abandoned episode must give back (a harness process
tree, a sandbox) registers a release with `on_set`; `set()` runs every registered release
once, newest first (so a harness dies before its sandbox closes), in the caller's thread,
and a failing release neither stops the others nor raises (its error is kept in `errors`).
Registering on a signal already set releases at once. Thread-safe: the scheduler sets it
from one thread while the episode runs in another.
"""
from __future__ import annotations

import threading
from typing import Callable


class Cancel:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._releases: list[Callable[[], None]] = []
        self.reason = ""
        """Why it was set (empty while not set)."""
        self.errors: list[str] = []
        """Releases that raised, as "Type: message"."""

    def is_set(self) -> bool:
        return self._set

    def set(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self._set:
                return
            self._set, self.reason = True, reason
            releases, self._releases = self._releases, []
        for release in reversed(releases):
            self._release(release)

    def on_set(self, release: Callable[[], None]) -> Callable[[], None]:
        """Run `release` when the signal is set (now, if it is); returns an unregister function."""
        with self._lock:
            if not self._set:
                self._releases.append(release)
                return lambda: self._forget(release)
        self._release(release)
        return lambda: None

    def _forget(self, release: Callable[[], None]) -> None:
        with self._lock:
            if release in self._releases:
                self._releases.remove(release)

    def _release(self, release: Callable[[], None]) -> None:
        try:
            release()
        except BaseException as e:  # one failed release must not keep the others
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            try:
                self.errors.append(f"{type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001 - unprintable
                self.errors.append(type(e).__name__)
