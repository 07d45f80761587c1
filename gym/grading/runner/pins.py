"""What the guard holds the test process to: the fingerprint of the runner's modules, the set of
code pinned before the repository was importable, and the literal its signed lines are made of.

Contract: pure functions over the interpreter's own state, called by the guard (guard.py) at
pin time and at each check. The supervisor executes this file and guard.py into ONE private
namespace (no module table lists it, its builtins are a copy), so code under test can neither
find nor patch these functions; guard.py uses them as globals of that namespace.

stdlib only: runs inside the sandbox on the sandbox's own python3 (3.9+).
"""
import sys

#: Fingerprinted: the runner, the stdlib test frameworks, and what the guard and the verdict lean on.
_WATCHED_MODULES = ("pytest", "_pytest", "pluggy", "py", "iniconfig", "unittest", "doctest", "builtins", "os",
                    "posixpath", "pathlib", "io", "hashlib", "inspect", "traceback", "linecache", "tokenize",
                    "importlib", "math", "operator", "functools", "contextlib")
#: Checked at every failing or call report; the rest at collection and at the end.
_HOT = frozenset({"pytest", "builtins", "unittest.case", "_pytest.reports", "_pytest.runner", "_pytest.python",
                  "_pytest.outcomes", "_pytest.python_api", "_pytest.approx", "_pytest.raises", "_pytest.skipping",
                  "_pytest.fixtures", "_pytest.main", "_pytest.nodes", "_pytest.unittest", "_pytest.subtests",
                  "pluggy._hooks", "pluggy._callers", "pluggy._manager", "pluggy._result", "sys",
                  "harnessrl_grader_unrig", "harnessrl_grader_worker"})
#: The runner's own modules: every global is pinned, not only functions and classes.
_OURS = "harnessrl_grader_"
_MUTABLE = frozenset({"_reprcompare", "_assertion_pass", "_config", "__warningregistry__", "environ", "_environ",
                      "_cache", "cache", "_bootstrap_external", "path_importer_cache"})
_FUNC_TYPES = ("function", "builtin_function_or_method", "method_descriptor", "wrapper_descriptor", "cython_function_or_method")


def _code_of(v):
    if type(v) is property:
        return tuple(getattr(x, "__code__", None) for x in (v.fget, v.fset, v.fdel))
    if type(v) in (classmethod, staticmethod):
        v = v.__func__
    return v.__code__ if type(v).__name__ == "function" else None


def _watched(name):
    return name.split(".")[0] in _WATCHED_MODULES or name in ("json", "json.encoder", "_pytest", "sys") \
        or name.startswith(_OURS)


def _fingerprint():
    """[(module, namespace, attr, value, code, member names)] over the watched modules."""
    snap = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not _watched(name):
            continue
        snap.append((name, sys.modules, name, mod, None, None))
        for attr, value in list(vars(mod).items()):
            if attr in _MUTABLE or (attr.startswith("__") and name != "builtins"):
                continue
            is_class = isinstance(value, type)
            if name.startswith(_OURS) and not (is_class or type(value).__name__ in _FUNC_TYPES):
                snap.append((name, vars(mod), attr, value, None, None))  # a table, a tuple of roots
                continue
            if is_class or type(value).__name__ in _FUNC_TYPES or type(value) in (classmethod, staticmethod):
                own = is_class and vars(value).get("__module__") == name
                snap.append((name, vars(mod), attr, value, _code_of(value), frozenset(vars(value)) if own else None))
                if own:
                    for member, mv in list(vars(value).items()):
                        if type(mv).__name__ == "function" or type(mv) in (property, classmethod, staticmethod):
                            snap.append((f"{name}.{attr}", vars(value), member, mv, _code_of(mv), None))
    return snap


def _pinned_code(modules):
    """{id: code} of every code object reachable from these modules' functions and classes."""
    seen, todo = {}, []
    for mod in modules:
        for value in list(vars(mod).values()):
            todo.append(value)
            if isinstance(value, type):
                todo.extend(list(vars(value).values()))
    while todo:
        v = todo.pop()
        if type(v) is property:
            todo.extend(x for x in (v.fget, v.fset, v.fdel) if x is not None)
            continue
        if type(v) in (classmethod, staticmethod):
            v = v.__func__
        tn = type(v).__name__
        if tn not in ("code", "function"):  # decorated: cached_property, partial, lru_cache, wraps
            for attr in ("__wrapped__", "func", "fget"):
                if hasattr(type(v), attr) or (attr == "__wrapped__" and tn == "_lru_cache_wrapper"):
                    try:
                        todo.append(getattr(v, attr))
                    except Exception:
                        pass
            continue
        if tn == "function" and "__wrapped__" in vars(v):  # functools.wraps: contextmanager, lru_cache...
            todo.append(vars(v)["__wrapped__"])
        c = v if tn == "code" else v.__code__
        if c is None or id(c) in seen:
            continue
        seen[id(c)] = c  # held: a freed code object's id could be reused by the agent's
        todo.extend(k for k in c.co_consts if type(k).__name__ == "code")
    return seen


def _literal(v, r=str.__repr__, i=int.__repr__):
    """A Python literal of exact built-in types, made without any function code under test can patch."""
    t = type(v)
    if t is str:
        return r(v)
    if v is None or t is bool:
        return "None" if v is None else "True" if v else "False"
    if t is int:
        return i(v)
    if t is dict:
        return "{" + ", ".join([_literal(k) + ": " + _literal(x) for k, x in dict.items(v)]) + "}"
    return "[" + ", ".join([_literal(x) for x in v]) + "]"
