"""Registries: plain dicts from a short name to "module:Name", imported lazily.

Every variant family in harnessrl (harnesses, sandbox backends, generation backends, dialects,
trainers, tool-call formats, task suites, row layouts, task formats' graders and checks) is one
such dict, declared once in the file that owns the family (docs/architecture.md, "Registries").
`resolve` turns a short name or a full "module:Name" path into the object; `check` validates a
name at config time without importing anything (`choice` is the same as a pydantic field type,
`arg_type` as an argparse type). An unknown name is an error that lists the valid ones, and a
path that does not import names what failed.

`DIALECTS` lives here, not with its implementations, because two floors need its names:
adapters declare and validate the dialect a harness speaks (floor 1), the proxy serves it
(floor 2); only the proxy resolves it.
"""
from __future__ import annotations

import argparse
import importlib
import re
from typing import Annotated, Any, Callable, Iterable

from pydantic import AfterValidator

_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

#: API dialects, by the one name each is known by (an adapter's `dialect`, a command config's
#: `dialect`, `check-adapter`, the proxy's request): name -> the proxy module that serves it
#: (`parse`, `response`, `Stream`, `error_body`, `ID_PREFIX`). A trajectory's
#: `CallRecord.dialect` is that module's name, as stored trajectories have always said.
DIALECTS: dict[str, str] = {
    "openai-chat": "harnessrl.gym.proxy:openai_chat",
    "openai-responses": "harnessrl.gym.proxy:openai_responses",
    "anthropic": "harnessrl.gym.proxy:anthropic_messages",
    "gemini": "harnessrl.gym.proxy:gemini",
}
#: Older spellings a user's config file may still use (the proxy modules' names) -> the name.
DIALECT_ALIASES: dict[str, str] = {target.rpartition(":")[2]: name for name, target in DIALECTS.items()
                                   if target.rpartition(":")[2] != name}


def _valid(registry: dict[str, str], extra: Iterable[str]) -> str:
    return ", ".join([*extra, *sorted(registry)])


def resolve(registry: dict[str, str], name: str, what: str, *, error: type[Exception] = ValueError,
            hint: str = "") -> Any:
    """The object `name` stands for in `registry` (or the "module:Name" path `name` is; a Name
    that is a submodule of the module is imported too). `what` names the kind in errors
    ("harness", "trainer", ...); `hint` adds other accepted forms."""
    target = registry.get(name, name)
    if ":" not in target:
        raise error(f"unknown {what} {name!r}; known: {_valid(registry, ())} "
                    f"(or a 'module:Class' path{hint})")
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
        if not hasattr(mod, attr) and "." not in attr:
            importlib.import_module(f"{module}.{attr}")  # a package's submodule ("pkg:module")
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError) as e:
        raise error(f"cannot load {what} {target!r}: {type(e).__name__}: {e}") from e


def check(registry: dict[str, str], name: str, what: str, *, extra: Iterable[str] = (), paths: bool = True,
          files: tuple[str, ...] = (), aliases: dict[str, str] | None = None,
          error: type[Exception] = ValueError) -> str:
    """`name` when it is a registry name, one of `extra`, (with `paths`) shaped like a
    "module:Name" path or a file name ending in one of `files`; an alias gives the name it
    stands for. Imports and reads nothing (a config validates, it never acts); anything else
    raises `error` listing the valid names."""
    extra = tuple(extra)
    if aliases and name in aliases:
        return aliases[name]
    if (name in registry or name in extra or (paths and _PATH.fullmatch(name))
            or (files and name.lower().endswith(files))):
        return name
    label = "valid" if extra else "known"
    more = (" (or a 'module:Class' path" + (f", or a {'/'.join(files)} file" if files else "") + ")") if paths else ""
    raise error(f"unknown {what} {name!r}; {label}: {_valid(registry, extra)}{more}")


def choice(registry: dict[str, str], what: str, **kw: Any) -> Any:
    """A pydantic field type: a str that `check` accepts (the registry read when validating,
    so an entry added later counts)."""
    return Annotated[str, AfterValidator(lambda v: check(registry, v, what, **kw))]


def arg_type(registry: dict[str, str], what: str, **kw: Any) -> Callable[[str], str]:
    """An argparse `type=` that `check`s its value; the error lists the valid names."""
    def parse(value: str) -> str:
        return check(registry, value, what, error=argparse.ArgumentTypeError, **kw)
    parse.__name__ = what
    return parse


#: A dialect's name, validated against `DIALECTS` (an old spelling becomes its name).
Dialect = choice(DIALECTS, "dialect", paths=False, aliases=DIALECT_ALIASES)
