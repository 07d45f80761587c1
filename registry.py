"""Registries: plain dicts from a short name to "module:Class", imported lazily.

Every registry in harnessrl (harness adapters, trainers, generation backends, tool-call
formats) resolves names here: a short name or a full "module:Class" path; an unknown name
is an error that lists the valid ones, and a path that does not import names what failed.
"""
from __future__ import annotations

import importlib
from typing import Any


def resolve(registry: dict[str, str], name: str, what: str, *, error: type[Exception] = ValueError,
            hint: str = "") -> Any:
    """The object `name` stands for in `registry` (or the "module:Class" path `name` is).
    `what` names the kind in errors ("harness", "trainer", ...); `hint` adds other accepted forms."""
    target = registry.get(name, name)
    if ":" not in target:
        raise error(f"unknown {what} {name!r}; known: {', '.join(sorted(registry))} "
                    f"(or a 'module:Class' path{hint})")
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise error(f"cannot load {what} {target!r}: {type(e).__name__}: {e}") from e
