"""The test process: pytest on base + the agent's kept diff + the hidden tests, the guard
installed first. It decides nothing: its plugin only tells the guard what pytest did (each
collected test, each report, the end), and the guard, after its own checks, signs it for the
supervisor (gym/grading/runner/guard.py).

Order, all before the repository is importable: the guard; PYTEST_*/PYTHON* variables dropped
and plugin autoloading off; the lent runner paths put before the interpreter's own
site-packages (so the grader chooses the pytest); pytest, pluggy, every built-in plugin and
the modules whose functions hand out frames imported; the comparison guard (unrig.py) set in
pytest's assertion rewriting and unittest's asserts; PYTEST_CURRENT_TEST never set (it names
the running test and its parameters); the repository put after the standard library; then
`harnessrl.pin`, and pytest.main.
"""
import importlib
import json
import os
import sys

#: Bound before any code under test runs: a `sys.audit` it swaps in later is not ours to call.
_audit = sys.audit


NEW_STYLE = True  # pluggy >= 1.1 (set in run): the test's exception is thrown into our wrapper


class Forwarder:
    """The grader's pytest plugin (passed to pytest.main, never loaded by name). Every method
    only reads what pytest hands it and raises one `harnessrl.*` audit event."""

    def __init__(self, progress):
        self.progress = progress
        self.config = None

    def pytest_configure(self, config):
        self.config = config

    def pytest_sessionstart(self, session):
        _audit("harnessrl.session")

    def pytest_itemcollected(self, item):
        _audit("harnessrl.item", item.nodeid, getattr(item, "obj", None), type(item).runtest)

    def pytest_collection_finish(self, session):
        mods = {id(m): m for m in (getattr(i, "module", None) for i in session.items) if m is not None}
        for plugin in self.config.pluginmanager.get_plugins():
            if type(plugin).__name__ == "module" and str(getattr(plugin, "__file__", "")).endswith("conftest.py"):
                mods[id(plugin)] = plugin
        _audit("harnessrl.modules", list(mods.values()))
        _audit("harnessrl.hooks", self.config.pluginmanager)
        _audit("harnessrl.collected", len(session.items))

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress.write(json.dumps({"start": nodeid}) + "\n")
        self.progress.flush()

    def pytest_runtest_call(self, item):
        """A wrapper around the test's call: what it sees is decided by frames already running
        when the code under test runs (pluggy throws the test's exception into this generator),
        so no patch the code makes during the call, self-restoring or not, changes it."""
        tc = getattr(item, "_testcase", None)
        nodeid = item.nodeid
        overridden = "runtest" in vars(item) or (tc is not None and item.name in vars(tc))
        _audit("harnessrl.call", nodeid, getattr(item, "obj", None), type(item).runtest, overridden)
        if NEW_STYLE:
            try:
                result = yield
            except BaseException:
                _audit("harnessrl.called", nodeid, True)
                raise
            _audit("harnessrl.called", nodeid, bool(vars(item).get("_excinfo")))
            return result
        outcome = yield
        _audit("harnessrl.called", nodeid, outcome.excinfo is not None or bool(vars(item).get("_excinfo")))

    def pytest_runtest_logreport(self, report):
        message = ""
        if report.outcome != "passed" and report.longrepr is not None:
            message = str(report.longrepr).strip().split("\n")[-1][:300]
        if report.when == "call" or report.outcome != "passed":
            _audit("harnessrl.hooks", self.config.pluginmanager)
        # xfail reports say "skipped", xpass "passed", as JUnit does
        _audit("harnessrl.report", report.nodeid, report.when, report.outcome, message, type(report))

    def pytest_collectreport(self, report):
        if report.outcome != "passed":
            _audit("harnessrl.collect_error", str(report.nodeid), str(report.longrepr).strip()[-300:])

    def pytest_sessionfinish(self, session, exitstatus):
        _audit("harnessrl.done", int(exitstatus))


def _lib_roots(extra):
    """Directories whose code is the interpreter's or the runner's, not the repository's."""
    roots = [os.path.dirname(os.__file__), *extra]
    roots += [p for p in sys.path if p.endswith(("site-packages", "dist-packages", "lib-dynload"))]
    return [p for p in roots if p and os.path.isdir(p)]


#: The runner's data that names or holds a test's inputs and expected values: read only by
#: pytest itself (code under test that reads them is told no, and that is evidence).
_RUNNER_DATA = (("_pytest.python", "Function", ("callspec", "funcargs")), ("_pytest.main", "Session", ("items",)),
                ("_pytest.runner", "SetupState", ("stack",)))


def _runner_data(name):
    def get(self, _audit=sys.audit):  # bound now: the getter's default, whose change is refused
        _audit("harnessrl.runner_data", name)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(name) from None

    def put(self, value):
        self.__dict__[name] = value

    def drop(self):
        self.__dict__.pop(name, None)
    return property(get, put, drop)


def _guard_runner_data():
    """Put the runner's test data behind `harnessrl.runner_data`; returns the getter's code."""
    for module, cls, names in _RUNNER_DATA:
        klass = getattr(importlib.import_module(module), cls, None)
        for name in names:
            if klass is not None and not isinstance(vars(klass).get(name), property):
                setattr(klass, name, _runner_data(name))
    return [_runner_data.__code__.co_consts[i] for i in range(len(_runner_data.__code__.co_consts))
            if type(_runner_data.__code__.co_consts[i]).__name__ == "code" and
            _runner_data.__code__.co_consts[i].co_name == "get"]


def run(spec, key_box, fd, guard, unrig):
    """Install the guard, set up pytest, pin, run; returns pytest's exit code."""
    guard.install(key_box, fd, {"repo": spec["repo"], "agent_files": spec.get("agent_files", []),
                                "test_files": spec.get("test_files", []), "private": spec.get("private", [])})
    lent = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.isabs(p) and os.path.isdir(p) and not os.access(p, os.W_OK)]
    for key in list(os.environ):
        if key.startswith(("PYTEST_", "PYTHON")):
            del os.environ[key]
    os.environ.update(spec.get("env", {}))
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # for the tests' own subprocesses
    sys.dont_write_bytecode = True
    runner_paths = [*spec.get("runner_paths", []), *lent]
    site = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
    at = site[0] if site else len(sys.path)
    sys.path[at:at] = runner_paths  # the grader's pytest before the interpreter's own
    for name in [m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest", "pluggy", "iniconfig")]:
        if runner_paths:  # a warm interpreter's pytest gives way to the lent one
            del sys.modules[name]
    import pytest
    import _pytest.config as pconfig
    import _pytest.runner as prunner
    for name in (*pconfig.essential_plugins, *pconfig.default_plugins):
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            pass
    for name in ("inspect", "traceback", "logging", "pathlib", "linecache", "tokenize", "unittest", "doctest", "gc"):
        importlib.import_module(name)
    prunner._update_current_test_var = lambda item, when: None
    guarded = _guard_runner_data()
    unrig.install(pytest)
    repo = os.path.realpath(spec["repo"])
    site = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
    extra = [os.path.join(repo, p) for p in spec.get("pythonpath", [])]
    at = site[0] if site else len(sys.path)
    sys.path[at:at] = [*extra, repo]
    global NEW_STYLE
    pluggy_version = sys.modules["pluggy"].__version__  # imported by pytest
    NEW_STYLE = tuple(int(x) for x in pluggy_version.split(".")[:2]) >= (1, 1)  # wrapper=True
    wrap = {"wrapper": True} if NEW_STYLE else {"hookwrapper": True}
    setattr(Forwarder, "pytest_runtest_call", pytest.hookimpl(tryfirst=True, **wrap)(Forwarder.pytest_runtest_call))
    for hook, order in (("pytest_sessionstart", "trylast"),
                        ("pytest_runtest_logreport", "tryfirst"), ("pytest_collection_finish", "tryfirst"),
                        ("pytest_itemcollected", "tryfirst"), ("pytest_sessionfinish", "trylast")):
        setattr(Forwarder, hook, pytest.hookimpl(**{order: True})(getattr(Forwarder, hook)))
    ours = [f.__code__ for f in vars(Forwarder).values() if type(f).__name__ == "function"] + unrig.codes() + guarded
    from _pytest.reports import TestReport
    reports = [TestReport, *[c for c in TestReport.__subclasses__() if c.__module__.startswith("_pytest.")]]
    _audit("harnessrl.pin", _lib_roots(runner_paths), ours, reports)
    plugin = Forwarder(open(spec["out"], "a", encoding="utf-8"))
    args = [*spec["args"], "-p", "no:cacheprovider", *spec["ids"]]
    spec.clear()
    return pytest.main(args, plugins=[plugin])
