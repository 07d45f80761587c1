"""Train / held-out split by function: no held-out task mutates a function seen in training.

Contract: `heldout_functions(functions, seed, fraction)` picks round(fraction * n) of the
given function keys ((project, file, qualname)) as held-out: the keys ordered by a seeded
SHA-256 of each key, the first ones taken. It depends only on the seed and the key set
(every function that has a mutation candidate, whatever the screening kept), so adding
tasks never moves a function across. `side(keys, held)` is "heldout" when every function a
task mutates is held-out, "train" when none is, and None (the task is dropped) when mixed.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

__all__ = ["FunctionKey", "heldout_functions", "side"]

FunctionKey = tuple[str, str, str]


def _rank(key: FunctionKey, seed: int) -> str:
    return hashlib.sha256(f"{seed}\0{key[0]}\0{key[1]}\0{key[2]}".encode()).hexdigest()


def heldout_functions(functions: Iterable[FunctionKey], seed: int, fraction: float) -> set[FunctionKey]:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be within [0, 1], got {fraction}")
    keys = sorted(set(functions), key=lambda k: (_rank(k, seed), k))
    return set(keys[:round(fraction * len(keys))])


def side(keys: Iterable[FunctionKey], held: set[FunctionKey]) -> str | None:
    flags = {k in held for k in keys}
    if flags == {True}:
        return "heldout"
    if flags == {False}:
        return "train"
    return None
