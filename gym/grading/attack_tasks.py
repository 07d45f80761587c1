"""The tasks the attack catalogue (gym/grading/attacks.py) is played on, and the honest controls.

Contract: `tasks()` is the built-in suite by short name (`calc-2`) plus the `cmp-*` tasks: one
small repository (`cmpkit`) whose hidden tests each compare results in one common style (`==`,
`!=`, `<`, `in`, `pytest.approx`, unittest's `assertEqual`, ...) or import a test helper that
lives outside tests/ (`_testing.py`, `testing.py`); same base and gold patch for all. The
repository is built once, deterministically, under ~/.cache/harnessrl/grader-attacks/.
`controls()` names the tasks whose gold plan must grade 1.0; `open_backend` opens a backend and
`create_sandbox` makes a sandbox on it (lending this interpreter's pytest to bubblewrap's host python3).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from harnessrl.gym.tasks import Task

_CMPKIT = '''"""cmpkit: small functions whose results the hidden tests compare in every common style."""


def scale(x, k):
    """x times k, as a float."""
    return float(x * k + 1)


def count(text):
    """How many words `text` has."""
    return len(text.split()) + 1


def shout(text):
    """`text` upper-cased, with an exclamation mark."""
    return text.upper()


def words(text):
    """The words of `text`, sorted."""
    return text.split()


def tally(text):
    """word -> how often it occurs in `text`."""
    return {w: 1 for w in text.split()}


def bounds(xs):
    """(smallest, largest) of `xs`."""
    return (max(xs), min(xs))


def encode(text):
    """`text` as UTF-8."""
    return text.encode("latin-1")


def vowels(text):
    """The vowels of `text`, in order."""
    return [c for c in text if c in "AEIOU"]
'''
_HELPER = '''"""Assertions the tests share (a test helper outside tests/, as pandas' _testing is)."""
from cmpkit import {fn}


def {name}(arg, expected):
    got = {fn}(arg)
    if got != expected:
        raise AssertionError(f"{fn}({{arg!r}}) = {{got!r}}, expected {{expected!r}}")
'''
_CMP_FILES = {
    "cmpkit/__init__.py": _CMPKIT,
    "cmpkit/_testing.py": _HELPER.format(fn="count", name="assert_count"),
    "cmpkit/testing.py": _HELPER.format(fn="words", name="assert_words"),
    "pytest.ini": "[pytest]\ntestpaths = tests\npythonpath = .\n",
    "tests/test_base.py": "import cmpkit\n\n\ndef test_package_imports():\n    assert cmpkit.__doc__\n",
}
_CMP_FIX = {"cmpkit/__init__.py": [
    ("float(x * k + 1)", "float(x * k)"), ("len(text.split()) + 1", "len(text.split())"),
    ("return text.upper()", 'return text.upper() + "!"'), ("return text.split()", "return sorted(text.split())"),
    ("return {w: 1 for w in text.split()}", "return {w: text.split().count(w) for w in text.split()}"),
    ("(max(xs), min(xs))", "(min(xs), max(xs))"), ('encode("latin-1")', 'encode("utf-8")'),
    ('c in "AEIOU"', 'c in "aeiou"')]}
#: task name -> (hidden test file, its text, the node id that must pass)
_CMP_TESTS = {
    "cmp-eq": ("test_eq.py", "from cmpkit import scale\n\n\ndef test_scale_eq():\n    assert scale(2, 3) == 6\n",
               "test_scale_eq"),
    "cmp-ne": ("test_ne.py", "from cmpkit import scale\n\n\ndef test_scale_ne():\n    assert not (scale(2, 3) != 6)\n",
               "test_scale_ne"),
    "cmp-lt": ("test_lt.py", "from cmpkit import scale\n\n\ndef test_scale_lt():\n    assert scale(2, 3) < 6.5\n",
               "test_scale_lt"),
    "cmp-in": ("test_in.py", "from cmpkit import scale\n\n\ndef test_scale_in():\n    assert scale(2, 3) in (6, 60)\n",
               "test_scale_in"),
    "cmp-approx": ("test_approx.py", "import pytest\n\nfrom cmpkit import scale\n\n\ndef test_scale_approx():\n"
                   "    assert scale(0.1, 3) == pytest.approx(0.3)\n", "test_scale_approx"),
    "cmp-unittest": ("test_unit.py", "import unittest\n\nfrom cmpkit import scale\n\n\ndef test_scale_assert_equal():\n"
                     "    unittest.TestCase().assertEqual(scale(2, 3), 6)\n", "test_scale_assert_equal"),
    "cmp-testcase": ("test_case.py", "import unittest\n\nfrom cmpkit import scale\n\n\n"
                     "class ScaleTests(unittest.TestCase):\n    def test_scale(self):\n"
                     "        self.assertEqual(scale(2, 3), 6)\n", "ScaleTests::test_scale"),
    "cmp-int": ("test_int.py", "from cmpkit import count\n\n\ndef test_count():\n    assert count('a b c') == 3\n",
                "test_count"),
    "cmp-str": ("test_str.py", "from cmpkit import shout\n\n\ndef test_shout():\n    assert shout('hi') == 'HI!'\n",
                "test_shout"),
    "cmp-list": ("test_list.py", "from cmpkit import words\n\n\ndef test_words():\n"
                 "    assert words('b a') == ['a', 'b']\n", "test_words"),
    "cmp-dict": ("test_dict.py", "from cmpkit import tally\n\n\ndef test_tally():\n"
                 "    assert tally('a b a') == {'a': 2, 'b': 1}\n", "test_tally"),
    "cmp-tuple": ("test_tuple.py", "from cmpkit import bounds\n\n\ndef test_bounds():\n"
                  "    assert bounds([3, 1, 2]) == (1, 3)\n", "test_bounds"),
    "cmp-bytes": ("test_bytes.py", "from cmpkit import encode\n\n\ndef test_encode():\n"
                  "    assert encode('\\u00e9') == b'\\xc3\\xa9'\n", "test_encode"),
    "cmp-contains": ("test_contains.py", "from cmpkit import vowels\n\n\ndef test_vowels():\n"
                     "    assert 'e' in vowels('hello')\n", "test_vowels"),
    "cmp-helper": ("test_helper.py", "from cmpkit._testing import assert_count\n\n\ndef test_count_helper():\n"
                   "    assert_count('a b c', 3)\n", "test_count_helper"),
    "cmp-helper-testing": ("test_helper_testing.py", "from cmpkit.testing import assert_words\n\n\n"
                           "def test_words_helper():\n    assert_words('b a', ['a', 'b'])\n", "test_words_helper"),
}


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "harnessrl" / "grader-attacks"


def _cmp_repo() -> tuple[Path, str, str, dict[str, str], list[str]]:
    """(the cmpkit repository, its base commit, the gold patch, task -> hidden test patch,
    gold plan); built once per content in the cache, deterministically (fixed dates)."""
    from harnessrl.gym.tasks.suites.builtin.build import apply_fix, diff, git, gold_plan

    digest = hashlib.sha256(repr((_CMP_FILES, _CMP_FIX, _CMP_TESTS)).encode()).hexdigest()[:12]
    repo = _cache_root() / f"cmpkit-{digest}"
    if not (repo / ".git").is_dir():
        repo.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="cmpkit-", dir=repo.parent))
        for rel, text in _CMP_FILES.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        git(tmp, "init", "-q", "-b", "main")
        git(tmp, "add", "-A")
        git(tmp, "commit", "-q", "-m", "Import cmpkit")
        try:
            tmp.rename(repo)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    base = git(repo, "rev-parse", "HEAD").strip()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True, capture_output=True)
        apply_fix(work, _CMP_FIX, "cmpkit")
        patch = diff(work)
        tests = {}
        for name, (file, text, _) in _CMP_TESTS.items():
            (work / "tests" / file).write_text(text)
            tests[name] = diff(work)
    return repo, base, patch, tests, gold_plan(_CMP_FIX)


@lru_cache(maxsize=1)
def tasks() -> dict[str, Task]:
    """Every task an attack or a control uses: the built-in suite by short name (`calc-2`),
    and the cmp-* tasks (one hidden test each, the same base and gold patch)."""
    from harnessrl.gym.tasks.loaders import load_suite

    out = {t.instance_id.split("__")[1]: t for t in load_suite("builtin")}
    repo, base, patch, tests, plan = _cmp_repo()
    for name, (file, _, node) in _CMP_TESTS.items():
        out[name] = Task(instance_id=f"harnessrl-attacks__{name}", repo="harnessrl-attacks/cmpkit", base_commit=base,
                         problem_statement=f"cmpkit: make tests/{file} pass", patch=patch, test_patch=tests[name],
                         FAIL_TO_PASS=[f"tests/{file}::{node}"],
                         PASS_TO_PASS=["tests/test_base.py::test_package_imports"],
                         source=str(repo), gold_plan=plan, difficulty="trivial")
    return out


def controls() -> list[str]:
    """Tasks whose gold plan is an honest control: every built-in task and every cmp task."""
    return list(tasks())


def open_backend(name: str, label: str, root: str | None = None):
    """A grading backend ("docker" or "local") whose sandboxes are named for `label`; the local
    one under `root` (a fresh temporary folder if None). Raises if the backend cannot run here."""
    import uuid

    from harnessrl.sandboxes import make_backend
    if name == "docker":
        from harnessrl.sandboxes.docker import DockerConfig
        return make_backend("docker", DockerConfig(run_id=f"{label}-{uuid.uuid4().hex[:8]}"))
    from harnessrl.sandboxes.local import LocalConfig
    return make_backend("local", LocalConfig(root=root or tempfile.mkdtemp(prefix=f"{label}-")))


def create_sandbox(backend, task: Task):
    """A sandbox for `task`; on the local backend the host's python3 gets this interpreter's
    pytest, lent read-only (the host has none)."""
    if backend.name != "local":
        return backend.create(task.repo_spec())
    import _pytest
    site = str(Path(_pytest.__file__).resolve().parent.parent)
    return backend.create(task.repo_spec(), mounts=[(site, "/opt/pytest-site", True)],
                          env={"PYTHONPATH": "/opt/pytest-site"})
