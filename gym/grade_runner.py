"""The hidden-test launcher: runs INSIDE the sandbox as `python3 -I grade_runner.py SPEC`.

Contract: the runner, its configuration and its plugins come from here, never from the agent.
`-I` drops the user site, PYTHON* variables and the script's / current directory from
sys.path; this file then drops PYTEST_* variables, disables plugin autoloading (no `pytest11`
entry points), imports pytest, pluggy and every built-in plugin *before* the repository is on
sys.path (so no file in the repository can shadow them), and puts the repository after the
standard library, so a new top-level `json.py` cannot shadow the stdlib either.

Results do not come from JUnit XML: the `Grader` plugin records each node id's outcome from
`pytest_runtest_logreport`, one JSON line per report, to an output path that appears on no
command line (it is in the SPEC file, which is deleted once read). Integrity: at start the
plugin fingerprints every function and class of pytest, _pytest and pluggy (identity and code
object), `builtins`, the import machinery and the trace hooks; after collection it also pins
the registered plugins and each collected test function's code. Every report is checked
against that, and a difference is written as a `violation` line, which the grader scores as
tampered. The last line, {"done": ...}, is written only when the session finished.

stdlib + pytest only; works with pytest 7 and 8+.
"""
import importlib
import json
import os
import sys

_RUNNER = ("pytest", "_pytest", "pluggy", "py", "iniconfig")
# Module globals pytest itself rebinds during a run (assertion hooks, per-test state).
_MUTABLE = {"_reprcompare", "_assertion_pass", "_config", "_pytest.assertion.util"}


# Checked at every test's report (the rest at collection and at the end): what decides a verdict.
_HOT = frozenset({"pytest", "builtins", "_pytest.reports", "_pytest.runner", "_pytest.python",
                  "_pytest.outcomes", "_pytest.python_api", "_pytest.raises", "_pytest.skipping",
                  "_pytest.fixtures", "_pytest.main", "_pytest.nodes", "_pytest.unittest",
                  "pluggy._hooks", "pluggy._callers", "pluggy._manager", "pluggy._result"})


def _code(v):
    f = getattr(v, "__func__", v)  # classmethod / staticmethod
    if isinstance(v, property):
        return tuple(getattr(x, "__code__", None) for x in (v.fget, v.fset, v.fdel))
    return getattr(f, "__code__", None)


def _fingerprint(only=None):
    """[(name, namespace, attr, value, code)] for the functions and classes (and the classes'
    members) of pytest, _pytest, pluggy and builtins (only the modules in `only`, if given),
    plus the import machinery and trace hooks. Holds the objects, so ids are never reused."""
    snap = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name.split(".")[0] in _RUNNER or name == "builtins") \
                or (only is not None and name not in only):
            continue
        snap.append((name, sys.modules, name, mod, None))
        for attr, value in list(vars(mod).items()):
            if attr in _MUTABLE or name in _MUTABLE or attr.startswith("__"):
                continue
            if callable(value) or isinstance(value, type):
                snap.append((name, vars(mod), attr, value, _code(value)))
            if isinstance(value, type) and getattr(value, "__module__", "") == name:
                members = vars(value)
                for member, mv in list(members.items()):
                    if callable(mv) or isinstance(mv, (property, classmethod, staticmethod)):
                        snap.append((f"{name}.{attr}", members, member, mv, _code(mv)))
    snap.append(("sys", sys.__dict__, "meta_path", tuple(sys.meta_path), None))
    snap.append(("sys", sys.__dict__, "path_hooks", tuple(sys.path_hooks), None))
    snap.append(("sys", sys.__dict__, "trace", (sys.gettrace(), sys.getprofile()), None))
    return snap


def _hot(snap):
    return [e for e in snap if e[0] == "sys" or e[0] in _HOT or e[0].rsplit(".", 1)[0] in _HOT]


def _changed(snap):
    """Names in `snap` whose object or code is not what it was."""
    out = []
    for name, space, attr, value, code in snap:
        if attr == "meta_path":
            now = tuple(sys.meta_path)
        elif attr == "path_hooks":
            now = tuple(sys.path_hooks)
        elif attr == "trace" and name == "sys":
            now = (sys.gettrace(), sys.getprofile())
        else:
            now = space.get(attr)
        same = now is value if not isinstance(value, tuple) else (
            len(now) == len(value) and all(a is b for a, b in zip(now, value)))
        if not same or (code is not None and _code(now) != code):
            out.append(f"{name}.{attr}")
            if len(out) >= 10:
                break
    return out


class Grader:
    """The grader's pytest plugin (passed to pytest.main, never loaded by name)."""

    def __init__(self, out, pytest_mod, repo):
        self.out, self.pytest, self.repo = out, pytest_mod, repo
        from _pytest.reports import TestReport
        self.report_type = TestReport
        self.before = None  # taken at session start, once pytest has set itself up
        self.plugins = None
        self.tests = {}
        self.violated = False

    def _write(self, record):
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def _violation(self, what):
        if not self.violated:  # the first one says it; the rest add nothing
            self.violated = True
            self._write({"violation": what})

    def _check(self, where, hot=False):
        if self.before is None:
            return self._violation(f"the session never started ({where})")
        changed = _changed(self.hot if hot else self.before)
        if changed:
            self._violation(f"test framework changed at run time ({where}): {', '.join(changed)}")
        if self.plugins is not None:
            now = {id(p) for p in self.config.pluginmanager.get_plugins()}
            new = [self.config.pluginmanager.get_name(p) or repr(p) for p in self.config.pluginmanager.get_plugins()
                   if id(p) not in self.plugins and not self._trusted_conftest(p)]
            if new or not self.plugins <= now:
                self._violation(f"pytest plugins changed at run time ({where}): {new[:5]}")

    def _trusted_conftest(self, plugin):
        """conftest.py modules in the repository: the grader reverted every one the agent touched."""
        path = os.path.realpath(str(getattr(plugin, "__file__", "") or ""))
        return os.path.basename(path) == "conftest.py" and path.startswith(self.repo + os.sep) \
            and os.path.isfile(path) and type(plugin).__name__ == "module"

    # -- hooks ---------------------------------------------------------------------------------
    def pytest_configure(self, config):
        self.config = config

    def pytest_sessionstart(self, session):
        self.before = _fingerprint()
        self.hot = _hot(self.before)

    def pytest_collection_finish(self, session):
        pm = self.config.pluginmanager
        self.plugins = {id(p) for p in pm.get_plugins()}
        for item in session.items:
            fn = getattr(item, "obj", None)
            self.tests[item.nodeid] = (id(fn), id(getattr(fn, "__code__", None)), id(type(item).runtest))
        self._write({"collected": len(session.items)})
        self._check("after collection")

    def pytest_runtest_logstart(self, nodeid, location):
        self._write({"start": nodeid})

    def pytest_runtest_call(self, item):
        fn = getattr(item, "obj", None)
        pinned = self.tests.get(item.nodeid)
        now = (id(fn), id(getattr(fn, "__code__", None)), id(type(item).runtest))
        if pinned is not None and (pinned != now or "runtest" in vars(item)):
            self._violation(f"test {item.nodeid} was replaced after collection")

    def pytest_runtest_logreport(self, report):
        if type(report) is not self.report_type:
            self._violation(f"report of {report.nodeid} is a {type(report).__name__}, not pytest's TestReport")
        if report.when == "call" or report.outcome != "passed":
            self._check(f"reporting {report.nodeid}", hot=True)
        outcome = report.outcome  # xfail reports say "skipped", xpass "passed", as JUnit does
        message = ""
        if report.outcome != "passed" and report.longrepr is not None:
            message = str(report.longrepr).strip().split("\n")[-1][:300]
        self._write({"report": report.nodeid, "when": report.when, "outcome": outcome, "message": message})

    def pytest_collectreport(self, report):
        if report.outcome != "passed":
            self._write({"collect_error": report.nodeid, "message": str(report.longrepr).strip()[-300:]})

    def pytest_sessionfinish(self, session, exitstatus):
        self._check("at the end")
        self._write({"done": int(exitstatus)})


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    os.remove(sys.argv[1])
    sys.argv = ["pytest"]
    # A runner the sandbox lends through PYTHONPATH (e.g. a read-only mount) is used only from
    # directories this user cannot write: nothing there can be the agent's.
    lent = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.isabs(p) and os.path.isdir(p) and not os.access(p, os.W_OK)]
    for key in list(os.environ):
        if key.startswith(("PYTEST_", "PYTHON")):
            del os.environ[key]
    os.environ.update(spec.get("env", {}))
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # for the tests' own subprocesses
    sys.dont_write_bytecode = True
    sys.path.extend([*spec.get("runner_paths", []), *lent])
    import pytest
    import pluggy  # noqa: F401
    import _pytest.config as pconfig
    for name in (*pconfig.essential_plugins, *pconfig.default_plugins):
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            pass
    repo = os.path.realpath(spec["repo"])
    site = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
    extra = [os.path.join(repo, p) for p in spec.get("pythonpath", [])]
    at = site[0] if site else len(sys.path)
    sys.path[at:at] = [*extra, repo]
    out = open(spec["out"], "a", encoding="utf-8")
    plugin = Grader(out, pytest, repo)
    for hook in ("pytest_sessionstart", "pytest_runtest_call", "pytest_runtest_logreport", "pytest_collection_finish"):
        setattr(Grader, hook, pytest.hookimpl(tryfirst=True)(getattr(Grader, hook)))
    args = [*spec["args"], "-p", "no:cacheprovider", *spec["ids"]]
    code = pytest.main(args, plugins=[plugin])
    out.flush()
    os._exit(int(code))  # no atexit handler of the code under test runs after the verdict


if __name__ == "__main__":
    main()
