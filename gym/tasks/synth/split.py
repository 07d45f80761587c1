"""Train / held-out split by function (or by file): no held-out task mutates a function seen in training.

Contract: `heldout_functions(functions, seed, fraction)` picks round(fraction * n) of the
given function keys ((project, file, qualname)) as held-out: the keys ordered by a seeded
SHA-256 of each key, the first ones taken. It depends only on the seed and the key set
(every function that has a mutation candidate, whatever the screening kept), so adding
tasks never moves a function across. `side(keys, held)` is "heldout" when every function a
task mutates is held-out, "train" when none is, and None (the task is dropped) when mixed.
`heldout_files(functions, seed, fraction)` holds out whole files instead: round(fraction * n)
of the (project, file) pairs, ranked the same way, and returns every function key in them, so
no held-out file (and so no held-out function) is touched by a training task.
`crossing(rows)` reads meta.jsonl rows and returns the functions and files that tasks on both
sides mutate (empty for a split by file; files only for a split by function).
"""
from __future__ import annotations

import hashlib
from typing import Iterable

__all__ = ["FunctionKey", "heldout_functions", "heldout_files", "side", "crossing"]

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


def heldout_files(functions: Iterable[FunctionKey], seed: int, fraction: float) -> set[FunctionKey]:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be within [0, 1], got {fraction}")
    keys = set(functions)
    files = sorted({(k[0], k[1]) for k in keys}, key=lambda f: (_rank((f[0], f[1], ""), seed), f))
    held = set(files[:round(fraction * len(files))])
    return {k for k in keys if (k[0], k[1]) in held}


def crossing(rows: Iterable[dict]) -> dict[str, list]:
    """Functions and files mutated by tasks of both splits (meta.jsonl rows: `split`, `functions`)."""
    seen: dict[str, dict[str, set]] = {"train": {"functions": set(), "files": set()},
                                       "heldout": {"functions": set(), "files": set()}}
    for r in rows:
        for f in r.get("functions") or []:
            seen[r["split"]]["functions"].add(tuple(f))
            seen[r["split"]]["files"].add((f[0], f[1]))
    return {k: sorted(seen["train"][k] & seen["heldout"][k]) for k in ("functions", "files")}
