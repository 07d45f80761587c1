"""The stores of one run: `stores.json`, the run-level index of a run served by several proxies.

Contract: a run with one proxy has one store (`trajectories.db`) and no index. A run with
several (`rollout.proxies`, `gym.proxies`) writes `stores.json` beside its first store when it
starts: `{"stores": [{"path": ..., "proxy": k, "url": ..., "pid": ...}, ...]}`, each path
relative to that folder and inside it. `read_index` gives the listed stores as absolute paths,
refusing (`RunStoresError`, naming the entry) a path that is absolute, climbs out of the folder
or names no file. `session_owners` maps every session id to the one store holding it; an id in
two stores is refused, naming it and both stores (ids are random, so a clash is a copied or
tampered store, never two episodes to guess between). Stores are opened read-only.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path, PurePosixPath
from typing import Any

STORES_FILE = "stores.json"
"""The index's file name, beside the run's first store."""


class RunStoresError(ValueError):
    """The run's store index cannot be read as one run (the message names the entry or id)."""


def write_index(folder: str | Path, entries: list[dict[str, Any]]) -> Path:
    """`folder/stores.json` listing `entries` (each with a `path` relative to `folder`)."""
    for e in entries:
        _relative(e["path"])
    path = Path(folder) / STORES_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stores": entries}, indent=1) + "\n")
    tmp.replace(path)  # a reader never sees half an index
    return path


def read_index(folder: str | Path) -> list[Path] | None:
    """The stores `folder/stores.json` lists, in its order (None: no index there)."""
    folder = Path(folder)
    index = folder / STORES_FILE
    if not index.is_file():
        return None
    try:
        doc = json.loads(index.read_text())
        entries = doc["stores"]
        paths = [e["path"] for e in entries]
    except (ValueError, KeyError, TypeError) as e:
        raise RunStoresError(f"{index}: not a store index ({type(e).__name__}: {e}); "
                             'expected {"stores": [{"path": ...}, ...]}') from None
    if not paths:
        raise RunStoresError(f"{index}: lists no store")
    out = []
    for i, p in enumerate(paths):
        try:
            rel = _relative(p)
        except ValueError as e:
            raise RunStoresError(f"{index}: stores[{i}].path: {e}") from None
        store = folder / rel
        if not store.is_file():
            raise RunStoresError(f"{index}: stores[{i}].path: {p!r} is not a file in {folder}")
        out.append(store)
    if len(set(out)) != len(out):
        raise RunStoresError(f"{index}: a store is listed twice: {paths}")
    return out


def session_owners(stores: list[Path]) -> dict[str, Path]:
    """Every session id of the run -> the store holding it; an id in two stores is refused."""
    owners: dict[str, Path] = {}
    for store in stores:
        for sid in session_ids(store):
            if sid in owners:
                raise RunStoresError(f"session {sid!r} is in two stores of one run: {owners[sid]} and {store}; "
                                     "a run's session ids are unique, so one of them is not this run's")
            owners[sid] = store
    return owners


def session_ids(store: Path) -> list[str]:
    """The session ids of one store, oldest first (read-only)."""
    db = sqlite3.connect(f"file:{Path(store).resolve()}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT id FROM sessions ORDER BY created, id")]
    finally:
        db.close()


def _relative(p: Any) -> PurePosixPath:
    if not isinstance(p, str) or not p:
        raise ValueError(f"{p!r} is not a path")
    rel = PurePosixPath(p)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{p!r} must be relative to the run folder and stay inside it")
    return rel
