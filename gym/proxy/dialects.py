"""The proxy's side of the dialect registry (`harnessrl.registry.DIALECTS`, the one declaration).

A dialect is one module here (`openai_chat.py`, ...) with `DIALECT` (its registry name),
`ID_PREFIX` (the reply ids it makes), `parse(body) -> ChatRequest`, `response(req, completion)`,
a `Stream` class and `error_body(status, message, kind, param)`; adding one is its module
plus one line in `DIALECTS` (and its route in `app.py`).
"""
from __future__ import annotations

from functools import cache
from types import ModuleType

from harnessrl.registry import DIALECTS, resolve


@cache
def dialect_module(name: str) -> ModuleType:
    """The module serving dialect `name`; an unknown name lists the valid ones."""
    return resolve(DIALECTS, name, "dialect")


def recorded_name(name: str) -> str:
    """What a trajectory's `CallRecord.dialect` says for dialect `name`: its module's name."""
    return DIALECTS[name].rpartition(":")[2]
