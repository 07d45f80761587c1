"""Naming an unexpected exception for a record, whatever it is.

`describe(e)` is "Type: message", capped, and never raises: an exception whose `__str__`
raises or returns a non-string must not turn the failure report into a second failure.
"""
from __future__ import annotations

MAX_CHARS = 2000


def describe(e: BaseException) -> str:
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001 - an unprintable exception still gets named
        msg = "<unprintable>"
    if not isinstance(msg, str):
        msg = "<unprintable>"
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"
