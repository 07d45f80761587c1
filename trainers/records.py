"""The error a trainer raises for a malformed trajectory record, naming where the fault is.

Shared by the modules that read records where they enter a trainer (`trainers.samples`:
shapes, masks, logprobs, versions; `trainers.behaviour`: each call's recorded sampling), so
neither imports the other for it.
"""
from __future__ import annotations


class RecordError(ValueError):
    """A trajectory record is malformed; names the session, segment and field."""

    def __init__(self, session_id: str, message: str, segment: int | None = None, field: str | None = None):
        self.session_id, self.segment, self.field = session_id, segment, field
        where = f"trajectory {session_id!r}"
        if segment is not None:
            where += f" segment {segment}"
        if field is not None:
            where += f" field {field!r}"
        super().__init__(f"{where}: {message}")
