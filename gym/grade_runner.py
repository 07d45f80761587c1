"""The hidden-test launcher: runs INSIDE the sandbox as `python3 -I grade_runner.py SPEC`.

Contract: the runner, its configuration and its plugins come from here, never from the agent.
`-I` drops the user site, PYTHON* variables and the script's / current directory from
sys.path; this file then drops PYTEST_* variables, disables plugin autoloading (no `pytest11`
entry points), imports pytest, pluggy and every built-in plugin *before* the repository is on
sys.path (so no file in the repository can shadow them), and puts the repository after the
standard library, so a new top-level `json.py` cannot shadow the stdlib either.

Results do not come from JUnit XML, nor from any file: the `Grader` plugin records each node
id's reports from `pytest_runtest_logreport` in memory and, once pytest.main returns, writes
them as one literal block to the stdout it held before any other code ran, between markers that
are in the SPEC file only (deleted once read). A file could be swapped under the runner by its
path; this stream cannot, and a second block is itself a sign of tampering. A progress file
(one line per test started) only tells the grader where a run that timed out was.

Integrity: once the session has started, the plugin fingerprints every function and class of
pytest, _pytest and pluggy (identity and code object), `builtins`, the import machinery and
the trace hooks, and pins the registered plugins; after collection, each collected test's
function and code (a test whose code comes from a file the agent changed, or from no file, is
a violation too). Each report (the hot part of the fingerprint), the end of collection and
the end of the session (all of it) are checked against that; a difference, a plugin that
appeared (other than the repository's own conftest.py files), or a replaced test function is
a `violation`, which the grader scores as tampered.

stdlib + pytest only; works with pytest 7 and 8+.
"""
import importlib
import json
import os
import sys

# Fingerprinted: the runner, and the stdlib test frameworks hidden tests may be written in.
_RUNNER = ("pytest", "_pytest", "pluggy", "py", "iniconfig", "unittest", "doctest")
# Bound before any code under test runs: the verdict is built and written with these only, so
# patching json, os.write or repr later changes nothing about what the grader reads.
_write, _repr, _exact_str, _exact_int = os.write, repr, str.__str__, int.__int__
# Module globals pytest itself rebinds during a run (assertion hooks, per-test state).
_MUTABLE = {"_reprcompare", "_assertion_pass", "_config"}


# Checked at every test's report (the rest at collection and at the end): what decides a verdict.
_HOT = frozenset({"pytest", "builtins", "unittest.case", "_pytest.reports", "_pytest.runner", "_pytest.python",
                  "_pytest.outcomes", "_pytest.python_api", "_pytest.approx", "_pytest.raises", "_pytest.skipping",
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
            if attr in _MUTABLE or name in _MUTABLE or (attr.startswith("__") and name != "builtins"):
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

    def __init__(self, progress, repo, agent_files=()):
        from _pytest.reports import TestReport
        self.progress, self.repo, self.report_type = progress, repo, TestReport
        self.agent_files = {os.path.realpath(os.path.join(repo, p)) for p in agent_files}
        self.before = self.hot = self.plugins = None  # pinned at session start
        self.tests = {}
        self.records = []
        self.violations = []
        self.finished = None

    def _note(self, record):
        """Keep a record for the verdict; stream it to the progress file (timeouts read it)."""
        self.records.append(record)
        self.progress.write(json.dumps(record) + "\n")
        self.progress.flush()

    def _violation(self, what):
        if not self.violations:  # the first one says it; the rest add nothing
            self.violations.append(what)
            self._note({"violation": what})

    def _check(self, where, hot=False):
        if self.before is None:
            return self._violation(f"the session never started ({where})")
        changed = _changed(self.hot if hot else self.before)
        if changed:
            self._violation(f"test framework changed at run time ({where}): {', '.join(changed)}")
        pm = self.config.pluginmanager
        now = pm.get_plugins()
        new = [pm.get_name(p) or repr(p) for p in now
               if not any(p is q for q in self.plugins) and not self._trusted_conftest(p)]
        if new or any(not any(q is p for p in now) for q in self.plugins):
            self._violation(f"pytest plugins changed at run time ({where}): {new[:5]}")

    def _trusted_conftest(self, plugin):
        """conftest.py modules in the repository: the grader reverted every one the agent touched."""
        path = os.path.realpath(str(getattr(plugin, "__file__", "") or ""))
        return os.path.basename(path) == "conftest.py" and path.startswith(self.repo + os.sep) \
            and os.path.isfile(path) and type(plugin).__name__ == "module"

    def verdict(self):
        """The records the grader needs (passing set-ups and teardowns go without saying), as
        a Python literal of exact built-in types (the grader reads it with ast.literal_eval)."""
        def lit(v):
            if isinstance(v, str):
                return _repr(_exact_str(v))
            if isinstance(v, bool) or v is None:
                return "None" if v is None else ("True" if v else "False")
            if isinstance(v, int):
                return _repr(_exact_int(v))
            if isinstance(v, dict):
                return "{" + ", ".join(lit(k) + ": " + lit(x) for k, x in list(dict.items(v))) + "}"
            return "[" + ", ".join(lit(x) for x in list(v)) + "]"
        keep = [r for r in self.records if r.get("when") == "call" or r.get("outcome") != "passed"]
        return lit({"done": self.finished, "violations": self.violations, "records": keep})

    # -- hooks (tryfirst / trylast are set in main, once pytest is imported) -----------------------
    def pytest_configure(self, config):
        self.config = config

    def pytest_sessionstart(self, session):  # trylast: after pytest's own session set-up
        self.before = _fingerprint()
        self.hot = _hot(self.before)
        self.plugins = list(self.config.pluginmanager.get_plugins())

    def pytest_itemcollected(self, item):  # pinned as soon as it exists, not after all collection
        fn = getattr(item, "obj", None)
        self.tests[item.nodeid] = (fn, getattr(fn, "__code__", None), type(item).runtest)

    def pytest_collection_finish(self, session):
        self._note({"collected": len(session.items)})
        self._check("after collection")

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress.write(json.dumps({"start": nodeid}) + "\n")
        self.progress.flush()

    def pytest_runtest_call(self, item):
        fn = getattr(item, "obj", None)
        pinned = self.tests.get(item.nodeid)
        now = (fn, getattr(fn, "__code__", None), type(item).runtest)
        if pinned is not None and (any(a is not b for a, b in zip(pinned, now)) or "runtest" in vars(item)):
            self._violation(f"test {item.nodeid} was replaced after collection")
        code = getattr(fn, "__code__", None)
        where = getattr(code, "co_filename", None)
        if where is not None and (not os.path.isfile(where) or os.path.realpath(where) in self.agent_files):
            self._violation(f"test {item.nodeid} runs code from {where}, not from a test file")

    def pytest_runtest_logreport(self, report):
        if type(report) is not self.report_type:
            self._violation(f"report of {report.nodeid} is a {type(report).__name__}, not pytest's TestReport")
        if report.when == "call" or report.outcome != "passed":
            self._check(f"reporting {report.nodeid}", hot=True)
        message = ""
        if report.outcome != "passed" and report.longrepr is not None:
            message = str(report.longrepr).strip().split("\n")[-1][:300]
        # xfail reports say "skipped", xpass "passed", as JUnit does
        self._note({"report": report.nodeid, "when": report.when, "outcome": report.outcome, "message": message})

    def pytest_collectreport(self, report):
        if report.outcome != "passed":
            self._note({"collect_error": report.nodeid, "message": str(report.longrepr).strip()[-300:]})

    def pytest_sessionfinish(self, session, exitstatus):
        self._check("at the end")
        self.finished = int(exitstatus)


def main():
    verdict_fd = os.dup(1)  # the verdict's channel, taken before any other code runs
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
    for hook, order in (("pytest_sessionstart", "trylast"), ("pytest_runtest_call", "tryfirst"),
                        ("pytest_runtest_logreport", "tryfirst"), ("pytest_collection_finish", "tryfirst"),
                        ("pytest_itemcollected", "tryfirst")):
        setattr(Grader, hook, pytest.hookimpl(**{order: True})(getattr(Grader, hook)))
    plugin = Grader(open(spec["out"], "a", encoding="utf-8"), repo, spec.get("agent_files", []))
    verdict, marker = plugin.verdict, spec["marker"]  # bound now: a patched class changes neither
    args = [*spec["args"], "-p", "no:cacheprovider", *spec["ids"]]
    spec.clear()  # no live dict holds the marker while the code under test runs
    code = pytest.main(args, plugins=[plugin])
    # The verdict travels on the run's own output, between markers only the grader knows: a
    # file could be swapped under the runner by its path, this stream cannot.
    block = ("\n" + marker + "-begin " + verdict() + " " + marker + "-end\n").encode()
    while block:
        block = block[_write(verdict_fd, block):]
    os._exit(int(code))  # no atexit handler of the code under test runs after the verdict


if __name__ == "__main__":
    main()
