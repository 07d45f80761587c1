"""Tasks in the test styles of real projects, for the grader's no-false-`tampered` tests.

`pyplug_task`: a small pluggy-like library in a folder named `pytest-pyplug`, with a
subpackage `py/`, a module `pluggy_compat.py` and its own pytest plugin (loaded through
`pytest_plugins`); its hidden tests are unittest.TestCase classes (setUpClass, setUp/tearDown,
subTest), parametrized tests whose ids hold slashes and dots, class-based tests, fixtures of
function and module scope (yield, conftest, plugin) and a non-strict xfail. The gold patch
fixes `..` in paths and tryfirst ordering, and its lines say `hookimpl`.

`more_itertools_task`: more-itertools 10.7.0 from its sdist, `windowed` broken at base (its
last, padded window dropped), the gold patch the project's own code; FAIL_TO_PASS are its
real unittest tests (one of them a subTest table, one hidden until grading).

Both are git repositories with fixed dates (tests/repo_helpers.git): the same shas, and so
the same cached sandbox images, every run.
"""
from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from harnessrl.gym.tasks import Task
from repo_helpers import git

PATH_BUGGY = '''"""Path helpers, named after the old `py` library's `py.path`."""
from __future__ import annotations


def normalize(path: str) -> str:
    """'a/./b/../c' -> 'a/c': empty and '.' segments dropped, '..' removes the segment before
    it ('..' above a relative start is kept, above '/' dropped); '' is '.'."""
    absolute = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        parts.append(part)
    body = "/".join(parts)
    return "/" + body if absolute else body or "."
'''
PATH_FIXED = PATH_BUGGY.replace('''            continue
        parts.append(part)''', '''            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
                continue
            if absolute:
                continue
        parts.append(part)''')

COMPAT_BUGGY = '''"""pluggy-style marks: `@hookimpl` (optionally tryfirst), and the marked callables of a namespace."""
from __future__ import annotations

from typing import Any, Callable

from pyplug.py.path import normalize

HOOK_MARK = "pyplug_hookimpl"


def hookimpl(func: Callable | None = None, *, tryfirst: bool = False) -> Any:
    """Mark `func` as a hook implementation: `@hookimpl` or `@hookimpl(tryfirst=True)`."""
    def mark(f: Callable) -> Callable:
        setattr(f, HOOK_MARK, {"tryfirst": tryfirst})
        return f
    return mark if func is None else mark(func)


def hookimpl_opts(obj: Any) -> dict | None:
    return getattr(obj, HOOK_MARK, None)


def hookimpls(namespace: Any) -> list[Callable]:
    """The marked callables of a dict or an object: tryfirst ones first, then by name."""
    items = namespace if isinstance(namespace, dict) else {n: getattr(namespace, n) for n in dir(namespace)}
    marked = [(name, obj) for name, obj in items.items() if hookimpl_opts(obj) is not None]
    return [obj for _, obj in sorted(marked, key=lambda m: (hookimpl_opts(m[1])["tryfirst"], m[0]))]


def plugin_key(path: str) -> str:
    """'plugins/./a/../b.py' -> 'plugins.b': a plugin's dotted name from its file's path."""
    return normalize(path).removesuffix(".py").replace("/", ".")
'''
COMPAT_FIXED = COMPAT_BUGGY.replace('key=lambda m: (hookimpl_opts(m[1])["tryfirst"]',
                                    'key=lambda m: (not hookimpl_opts(m[1])["tryfirst"]')

PYPLUG_BASE = {
    "pyproject.toml": '[project]\nname = "pyplug"\nversion = "0.3.0"\nrequires-python = ">=3.9"\n',
    "README.md": "# pyplug\n\nA small plugin manager in the style of pluggy.\n",
    "conftest.py": '# The project\'s own fixtures, as a plugin.\npytest_plugins = ["pyplug.pytest_plugin"]\n',
    "pyplug/__init__.py": '''"""pyplug: a small plugin manager in the style of pluggy."""
from pyplug.manager import PluginManager
from pyplug.pluggy_compat import hookimpl, hookimpls, plugin_key
from pyplug.py.path import normalize

__all__ = ["PluginManager", "hookimpl", "hookimpls", "normalize", "plugin_key"]
''',
    "pyplug/py/__init__.py": '"""Path helpers (the name is the old `py` library\'s)."""\n',
    "pyplug/py/path.py": PATH_BUGGY,
    "pyplug/pluggy_compat.py": COMPAT_BUGGY,
    "pyplug/manager.py": '''"""Plugins by name, and calls of one hook across all of them."""
from __future__ import annotations

from typing import Any

from pyplug.pluggy_compat import hookimpls


class PluginManager:
    def __init__(self) -> None:
        self._plugins: dict[str, Any] = {}

    def register(self, plugin: Any, name: str | None = None) -> str:
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in self._plugins:
            raise ValueError(f"plugin {name!r} already registered")
        self._plugins[name] = plugin
        return name

    def unregister(self, name: str) -> Any:
        return self._plugins.pop(name)

    def names(self) -> list[str]:
        return sorted(self._plugins)

    def call(self, hook: str, **kwargs: Any) -> list[Any]:
        """Every registered implementation of `hook`, tryfirst ones first, then by plugin name."""
        found = {f"{name}:{hook}": getattr(p, hook) for name, p in self._plugins.items()
                 if callable(getattr(p, hook, None))}
        return [impl(**kwargs) for impl in hookimpls(found)]
''',
    "pyplug/pytest_plugin.py": '''"""pytest fixtures for projects built on pyplug: `pytest_plugins = ["pyplug.pytest_plugin"]`."""
import pytest

from pyplug.manager import PluginManager


@pytest.fixture
def plugin_manager():
    """A fresh PluginManager, emptied again after the test."""
    pm = PluginManager()
    yield pm
    for name in pm.names():
        pm.unregister(name)
''',
    "tests/conftest.py": '''import pytest

from pyplug import PluginManager

EVENTS = []


@pytest.fixture(scope="module")
def sample_paths():
    """Built once per module."""
    EVENTS.append("sample_paths")
    return {"flat": "plugins/alpha.py", "dotted": "plugins/./beta.py", "parent": "plugins/extra/../gamma.py"}


@pytest.fixture
def manager():
    pm = PluginManager()
    yield pm
    for name in pm.names():
        pm.unregister(name)
    assert pm.names() == []
''',
}

# The hidden tests (the task's test_patch): every style, in three files.
PYPLUG_TESTS = {
    "tests/test_path_unittest.py": '''import unittest

from pyplug import plugin_key
from pyplug.py.path import normalize


class NormalizeTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = "/srv/plugins"

    def setUp(self):
        self.seen = []

    def tearDown(self):
        self.assertTrue(all(isinstance(s, str) for s in self.seen))

    def check(self, raw, expected):
        got = normalize(raw)
        self.seen.append(got)
        self.assertEqual(got, expected)

    def test_plain(self):
        self.check("a/b/c", "a/b/c")

    def test_dot_segments(self):
        self.check("./a/./b/", "a/b")

    def test_absolute_root_kept(self):
        self.check(self.root + "//x", "/srv/plugins/x")

    def test_parent_segments(self):
        self.check("a/b/../c", "a/c")

    def test_table(self):
        for raw, expected in [("a/../b", "b"), ("/a/b/../../c", "/c"), ("../a", "../a"), ("/..", "/"), ("a/..", ".")]:
            with self.subTest(raw=raw):
                self.check(raw, expected)

    def test_table_without_parents(self):
        for raw, expected in [("a", "a"), ("/a/./b", "/a/b"), ("", "."), ("/", "/")]:
            with self.subTest(raw=raw):
                self.check(raw, expected)


class PluginKeyTests(unittest.TestCase):
    def test_flat(self):
        self.assertEqual(plugin_key("plugins/alpha.py"), "plugins.alpha")

    def test_parent(self):
        self.assertEqual(plugin_key("plugins/extra/../gamma.py"), "plugins.gamma")
''',
    "tests/test_path_pytest.py": '''import pytest

from pyplug import normalize, plugin_key


@pytest.mark.parametrize("raw, expected", [
    ("a/b", "a/b"),
    ("a/./b", "a/b"),
    ("a/b/../c", "a/c"),
    ("/x/../y", "/y"),
    pytest.param("a//b", "a/b", id="double-slash"),
])
def test_normalize(raw, expected):
    assert normalize(raw) == expected


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_nested_parents(depth):
    assert normalize("a/" * depth + "../" * depth + "z") == "z"


@pytest.mark.xfail(reason="'..' was kept as a name before 0.3.1", strict=False)
def test_parent_above_a_relative_start_is_kept():
    assert normalize("a/../..") == ".."


class TestPluginKey:
    def test_flat_key(self, sample_paths):
        assert plugin_key(sample_paths["flat"]) == "plugins.alpha"

    def test_dotted_key(self, sample_paths):
        assert plugin_key(sample_paths["dotted"]) == "plugins.beta"

    def test_parent_key(self, sample_paths):
        assert plugin_key(sample_paths["parent"]) == "plugins.gamma"
''',
    "tests/test_manager.py": '''import pytest

from pyplug import hookimpl


class Early:
    @hookimpl(tryfirst=True)
    def configure(self, log):
        log.append("early")
        return "early"


class Late:
    @hookimpl
    def configure(self, log):
        log.append("late")
        return "late"


class TestRegistry:
    def test_register_and_names(self, manager):
        manager.register(Late(), "late")
        manager.register(Early(), "early")
        assert manager.names() == ["early", "late"]

    def test_duplicate_name_refused(self, manager):
        manager.register(Late(), "late")
        with pytest.raises(ValueError, match="already registered"):
            manager.register(Early(), "late")

    def test_plugin_fixture_from_the_package(self, plugin_manager):
        plugin_manager.register(Late(), "late")
        assert plugin_manager.unregister("late").__class__ is Late


class TestCallOrder:
    def test_single_plugin(self, manager):
        manager.register(Late(), "late")
        assert manager.call("configure", log=[]) == ["late"]

    def test_tryfirst_runs_first(self, manager):
        manager.register(Late(), "a_late")  # sorts first by name: tryfirst must still win
        manager.register(Early(), "z_early")
        log = []
        assert manager.call("configure", log=log) == ["early", "late"]
        assert log == ["early", "late"]
''',
}

PYPLUG_F2P = [
    "tests/test_path_unittest.py::NormalizeTests::test_parent_segments",
    "tests/test_path_unittest.py::NormalizeTests::test_table",
    "tests/test_path_unittest.py::PluginKeyTests::test_parent",
    "tests/test_path_pytest.py::test_normalize[a/b/../c-a/c]",
    "tests/test_path_pytest.py::test_normalize[/x/../y-/y]",
    "tests/test_path_pytest.py::test_nested_parents[1]",
    "tests/test_path_pytest.py::test_nested_parents[3]",
    "tests/test_path_pytest.py::test_parent_above_a_relative_start_is_kept",  # xfail at base, XPASS with gold
    "tests/test_path_pytest.py::TestPluginKey::test_parent_key",
    "tests/test_manager.py::TestCallOrder::test_tryfirst_runs_first",
]
PYPLUG_P2P = [
    "tests/test_path_unittest.py::NormalizeTests::test_plain",
    "tests/test_path_unittest.py::NormalizeTests::test_dot_segments",
    "tests/test_path_unittest.py::NormalizeTests::test_absolute_root_kept",
    "tests/test_path_unittest.py::NormalizeTests::test_table_without_parents",
    "tests/test_path_unittest.py::PluginKeyTests::test_flat",
    "tests/test_path_pytest.py::test_normalize[a/b-a/b]",
    "tests/test_path_pytest.py::test_normalize[a/./b-a/b]",
    "tests/test_path_pytest.py::test_normalize[double-slash]",
    "tests/test_path_pytest.py::test_nested_parents[0]",
    "tests/test_path_pytest.py::TestPluginKey::test_flat_key",
    "tests/test_path_pytest.py::TestPluginKey::test_dotted_key",
    "tests/test_manager.py::TestRegistry::test_register_and_names",
    "tests/test_manager.py::TestRegistry::test_duplicate_name_refused",
    "tests/test_manager.py::TestRegistry::test_plugin_fixture_from_the_package",
    "tests/test_manager.py::TestCallOrder::test_single_plugin",
]

MORE_ITERTOOLS = "more_itertools-10.7.0.tar.gz"
WINDOWED_FIXED = "    padding = (fillvalue,) * (n - 1 if step >= n else step - 1)\n"
WINDOWED_BUGGY = "    padding = ()\n"
FILLVALUE_STEP_TEST = '''    def test_fillvalue_step(self):
        actual = list(mi.windowed([1, 2, 3, 4, 5], 3, fillvalue='!', step=3))
        expected = [(1, 2, 3), (4, 5, '!')]
        self.assertEqual(actual, expected)

'''


def _write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


def _diff_of(repo: Path, files: dict[str, str]) -> str:
    """The git diff that writing `files` makes to HEAD (the tree is left at HEAD)."""
    _write(repo, files)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached", "--no-color") + "\n"
    git(repo, "reset", "-q", "--hard", "HEAD")
    git(repo, "clean", "-qfdx")
    return diff


def _commit(repo: Path, files: dict[str, str]) -> str:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    _write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return git(repo, "rev-parse", "HEAD")


def pyplug_task(root: Path, workdir: str = "/workspace/pytest-pyplug") -> Task:
    """The pyplug repository under `root/pytest-pyplug` and its task (10 FAIL_TO_PASS, 15 PASS_TO_PASS)."""
    repo = root / "pytest-pyplug"
    base = _commit(repo, PYPLUG_BASE)
    return Task(
        instance_id="pytest-pyplug__pyplug-1", repo="pytest-fixtures/pytest-pyplug", base_commit=base,
        problem_statement="normalize() keeps '..' segments, and tryfirst hook implementations run last.",
        patch=_diff_of(repo, {"pyplug/py/path.py": PATH_FIXED, "pyplug/pluggy_compat.py": COMPAT_FIXED}),
        test_patch=_diff_of(repo, PYPLUG_TESTS), FAIL_TO_PASS=PYPLUG_F2P, PASS_TO_PASS=PYPLUG_P2P,
        source=str(repo), workdir=workdir)


def more_itertools_task(root: Path, sdist: Path) -> Task:
    """more-itertools from `sdist` under `root/more-itertools`, `windowed` broken at base."""
    repo = root / "more-itertools"
    with tarfile.open(sdist) as tar:
        tar.extractall(root, filter="data")
    shutil.move(str(root / sdist.name.removesuffix(".tar.gz")), repo)
    more, tests = repo / "more_itertools/more.py", repo / "tests/test_more.py"
    real_more, real_tests = more.read_text(), tests.read_text()
    assert real_more.count(WINDOWED_FIXED) == 1 and real_tests.count(FILLVALUE_STEP_TEST) == 1
    more.write_text(real_more.replace(WINDOWED_FIXED, WINDOWED_BUGGY))
    tests.write_text(real_tests.replace(FILLVALUE_STEP_TEST, ""))  # the hidden test
    base = _commit(repo, {})
    windowed = "tests/test_more.py::WindowedTests::"
    return Task(
        instance_id="more-itertools__more-itertools-1", repo="more-itertools/more-itertools", base_commit=base,
        problem_statement="windowed() with step drops the last, partly filled window.",
        patch=_diff_of(repo, {"more_itertools/more.py": real_more}),
        test_patch=_diff_of(repo, {"tests/test_more.py": real_tests}),
        FAIL_TO_PASS=[windowed + "test_step", windowed + "test_fillvalue_step"],
        PASS_TO_PASS=[windowed + "test_basic", windowed + "test_fillvalue", windowed + "test_invalid_step",
                      "tests/test_more.py::ChunkedTests::test_even", "tests/test_more.py::ChunkedTests::test_odd",
                      "tests/test_more.py::LastTests::test_basic", "tests/test_more.py::LastTests::test_empty",
                      "tests/test_recipes.py::TakeTests::test_simple_take",
                      "tests/test_recipes.py::TailTests::test_sized_less"],
        source=str(repo))
