"""Typed readers of wire fields: each returns a field's value or raises a 400 naming it.

Contract: the dialect parsers read every field they use through these, so a wrong type
anywhere in a request is the dialect's 400 with `param` set to the field's path (e.g.
`messages[3].tool_call_id`), decided before anything is rendered or generated. A bad
field never becomes a TypeError deep in the pipeline, a 5xx, or an error event after a
200. Absent and `null` read as "not given"; JSON booleans are never numbers here.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Iterator

from .errors import bad_request

try:
    import orjson

    _loads = orjson.loads  # a depth limit of its own: never a RecursionError
except ImportError:  # pragma: no cover
    _loads = json.loads

INT63 = 2 ** 63
"""Integers on the wire stay below this (SQLite, torch seeds and JSON readers agree on int64)."""

MAX_DEPTH = 64
"""Deepest nesting of objects/arrays accepted anywhere in a body (Python's own JSON encoder
recurses, and tool schemas or arguments are re-encoded)."""


def kind(v: Any) -> str:
    """The JSON type of a value, as an error message names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def path(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _wrong(p: str, want: str, v: Any):
    return bad_request(f"{p} must be {want}, got {kind(v)}", p)


def string(obj: dict, key: str, where: str = "", *, required: bool = False, max_len: int | None = None) -> str | None:
    v = obj.get(key)
    p = path(where, key)
    if v is None:
        if required:
            raise bad_request(f"{p} is required (a string)", p)
        return None
    if v.__class__ is not str:
        raise _wrong(p, "a string", v)
    if max_len is not None and len(v) > max_len:
        raise bad_request(f"{p} is {len(v)} characters; at most {max_len} are accepted", p)
    return v


def boolean(obj: dict, key: str, where: str = "") -> bool | None:
    v = obj.get(key)
    if v is None or v is True or v is False:
        return v
    raise _wrong(path(where, key), "a boolean", v)


def integer(obj: dict, key: str, where: str = "", *, lo: int = -INT63, hi: int = INT63 - 1) -> int | None:
    """An int in [lo, hi] (a float with an integral value is refused too: the dialects do)."""
    v = obj.get(key)
    if v is None:
        return None
    p = path(where, key)
    if v.__class__ is not int:
        raise _wrong(p, "an integer", v)
    if not lo <= v <= hi:
        raise bad_request(f"{p} = {v} is out of range [{lo}, {hi}]", p)
    return v


def number(obj: dict, key: str, where: str = "", *, lo: float, hi: float) -> float | None:
    """A finite number in [lo, hi], as a float."""
    v = obj.get(key)
    if v is None:
        return None
    p = path(where, key)
    if v.__class__ not in (int, float):
        raise _wrong(p, "a number", v)
    f = float(v)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise bad_request(f"{p} = {v} is out of range [{lo}, {hi}]", p)
    return f


def array(obj: dict, key: str, where: str = "") -> list | None:
    v = obj.get(key)
    if v is None or v.__class__ is list:
        return v
    raise _wrong(path(where, key), "an array", v)


def objects(o: dict, key: str, where: str = "") -> Iterator[tuple[str, dict]]:
    """The array `key` of objects, each with its path (e.g. "tools[2]"); absent: nothing.
    Lazy: an item that is not an object is refused when it is reached, so a caller checking
    each item as it goes names the first bad field in order."""
    base = path(where, key)
    for i, v in enumerate(array(o, key, where) or []):
        p = f"{base}[{i}]"
        if v.__class__ is not dict:
            raise _wrong(p, "an object", v)
        yield p, v


def obj(o: dict, key: str, where: str = "") -> dict | None:
    v = o.get(key)
    if v is None or v.__class__ is dict:
        return v
    raise _wrong(path(where, key), "an object", v)


def str_or_obj(o: dict, key: str, where: str = "") -> str | dict | None:
    v = o.get(key)
    if v is None or v.__class__ in (str, dict):
        return v
    raise _wrong(path(where, key), "a string or an object", v)


def stop_list(o: dict, key: str, *, max_items: int, single: bool) -> list[str]:
    """Stop strings: a list of strings (or, when `single`, one string); empty strings are dropped."""
    v = o.get(key)
    if v is None:
        return []
    if single and v.__class__ is str:
        v = [v]
    if v.__class__ is not list:
        raise _wrong(key, "a string or an array of strings" if single else "an array of strings", v)
    if len(v) > max_items:
        raise bad_request(f"{key} has {len(v)} entries; at most {max_items} are accepted", key)
    for i, s in enumerate(v):
        if s.__class__ is not str:
            raise _wrong(f"{key}[{i}]", "a string", s)
    return [s for s in v if s]


def json_args(o: dict, key: str, where: str) -> str | None:
    """Tool-call arguments: JSON text, or an object (re-encoded as JSON text). Text that is
    not JSON passes as it is (a harness may replay a malformed call); JSON text nested past
    `MAX_DEPTH` is refused, like any body (the renderer decodes it again)."""
    v = o.get(key)
    p = path(where, key)
    if v.__class__ is str:
        try:
            check_depth(_loads(v), p)
        except ValueError:  # not JSON (orjson's JSONDecodeError), unless it was too deep for orjson
            if "depth" in str(sys.exc_info()[1]):
                raise bad_request(f"{p} holds JSON nested deeper than {MAX_DEPTH} levels", p) from None
        return v
    if v is None:
        return v
    if v.__class__ is dict:
        return json.dumps(v)
    raise _wrong(p, "a string of JSON or an object", v)


def check_depth(value: Any, where: str = "", limit: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `limit`, naming the path (iterative: cannot recurse too deep)."""
    stack = [(value, 0)]
    while stack:  # fast pass: no path bookkeeping
        v, d = stack.pop()
        if d > limit:
            break
        if v.__class__ is dict:
            stack.extend((x, d + 1) for x in v.values() if x.__class__ in (dict, list))
        elif v.__class__ is list:
            stack.extend((x, d + 1) for x in v if x.__class__ in (dict, list))
    else:
        return
    nodes: list[tuple[Any, int, int, str | int]] = [(value, 0, -1, "")]  # value, depth, parent, key
    todo = [0]
    while todo:
        i = todo.pop()
        v, d, _, _ = nodes[i]
        if d > limit:
            keys = []
            while i > 0:
                keys.append(nodes[i][3])
                i = nodes[i][2]
            p = where
            for k in reversed(keys):
                p = path(p, k)
            raise bad_request(f"{p} is nested deeper than {limit} levels", p or None)
        kids = v.items() if v.__class__ is dict else enumerate(v)
        for k, x in kids:
            if x.__class__ in (dict, list):
                nodes.append((x, d + 1, i, k))
                todo.append(len(nodes) - 1)
