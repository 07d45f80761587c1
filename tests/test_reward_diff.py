"""The agent's diff cut per path and sorted (gym/grading/diff.py), on patches real git wrote."""
from __future__ import annotations

import subprocess
from pathlib import Path

from harnessrl.gym.grading.diff import pytest_section, split_patch, triage


def git_diff(tmp_path: Path, files: dict[str, bytes | None]) -> str:
    """A repository with `base.py` and `pkg/old.py`, then `files` written (None: deleted)."""
    repo = tmp_path / "r"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *a], cwd=repo, check=True,
                                    capture_output=True).stdout.decode()
    run("init", "-q")
    (repo / "pkg").mkdir()
    (repo / "base.py").write_text("x = 1\n")
    (repo / "pkg" / "old.py").write_text("y = 2\n")
    run("add", "-A")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    for path, data in files.items():
        target = repo / path
        if data is None:
            target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    run("add", "-A", "-f")
    return run("diff", "--cached", "--binary", "--no-renames", "HEAD")


def test_split_patch_reads_every_path_git_writes(tmp_path):
    patch = git_diff(tmp_path, {"base.py": b"x = 2\n", "pkg/old.py": None, "sub dir/conftest.py": b"#\n",
                                "t\u00e9st \"q\".py": b"z = 3\n", "blob.bin": bytes(range(256))})
    changes = split_patch(patch)
    assert [(c.path, c.new, c.deleted) for c in changes] == [
        ("base.py", False, False), ("blob.bin", True, False), ("pkg/old.py", False, True),
        ("sub dir/conftest.py", True, False), ("t\u00e9st \"q\".py", True, False)]
    assert "".join(c.text for c in changes) == patch
    assert changes[0].added_lines() == ["x = 2"]


def test_triage_sorts_each_change_into_one_place(tmp_path):
    files = {
        "pkg/fix.py": b"def f():\n    return 1\n",                          # kept
        "pkg/conftest.py": b"import pytest\n",                               # reverted: runner config
        "tests/test_new.py": b"import pytest\n",                             # reverted: a test file
        "pytest.ini": b"[pytest]\naddopts = -p cheat\n",                     # reverted
        "hidden.py": b"x = 1\n",                                             # reverted: the hidden patch's
        "pkg/__pycache__/fix.cpython-311.pyc": b"\0",                        # dropped: bytecode
        "pkg.egg-info/PKG-INFO": b"Name: pkg\n",                             # dropped: build artefact
        "json.py": b"loads = None\n",                                        # dropped: new stdlib shadow
        "src/fnmatch.py": b"x = 1\n",                                        # dropped: same, src layout
        "pytest.py": b"import sys\n",                                        # tampered: runner shadow
        "pluggy/__init__.py": b"",                                           # tampered
        "usercustomize.py": b"",                                             # tampered: site hook
        "pkg/x.pth": b"import os\n",                                         # tampered
        "cheat.dist-info/entry_points.txt": b"[pytest11]\nc = cheat\n",      # tampered: plugin entry point
        "pkg/hook.py": b"from _pytest import reports\n",                     # kept: words are no evidence
        "pkg/api.py": b"def f(x):\n    return getattr(__import__('pytest'), 'x')\n",  # kept: (the runner judges)
        "pkg/py/util.py": b"x = 1\n",                                         # kept: a deep py/ shadows nothing
        "pkg/_testing.py": b"def assert_ok(x):\n    pass\n",                # reverted: a test helper
        "pkg/doc.py": b'"""Run the tests with pytest. Then relax."""\n',     # kept: prose is fine
        "pkg/spy.py": b"import sys\nf = sys._getframe(1)\n",                  # kept: the runner refuses it live
        "pytest.toml": b"[pytest]\n",                                           # reverted: pytest 9 config
    }
    out = triage(split_patch(git_diff(tmp_path, files)), protected={"hidden.py"})
    assert [c.path for c in out.kept] == ["pkg/api.py", "pkg/doc.py", "pkg/fix.py", "pkg/hook.py", "pkg/py/util.py",
                                          "pkg/spy.py"]
    assert out.reverted == ["hidden.py", "pkg/_testing.py", "pkg/conftest.py", "pytest.ini", "pytest.toml",
                            "tests/test_new.py"]
    assert out.dropped == ["json.py", "pkg.egg-info/PKG-INFO", "pkg/__pycache__/fix.cpython-311.pyc", "src/fnmatch.py"]
    assert [(e["kind"], e["where"], e["what"].split(":")[0]) for e in out.tampered] == [
        ("runner_shadow", "cheat.dist-info/entry_points.txt", "declares a pytest11 plugin entry point"),
        ("runner_shadow", "pkg/x.pth", "is a .pth site hook"),
        ("runner_shadow", "pluggy/__init__.py", "shadows the test runner (pluggy)"),
        ("runner_shadow", "pytest.py", "shadows the test runner (pytest)"),
        ("runner_shadow", "usercustomize.py", "is a site hook (usercustomize)"),
    ]
    assert out.kept_patch() == "".join(c.text for c in out.kept)


def test_pytest_section_sees_only_pytest_configuration():
    cfg = "[metadata]\nname = a\n[tool:pytest]\naddopts = -q\n"
    assert pytest_section("setup.cfg", cfg) == pytest_section("setup.cfg", cfg.replace("name = a", "name = b"))
    assert pytest_section("setup.cfg", cfg) != pytest_section("setup.cfg", cfg.replace("-q", "-p cheat"))
    toml = '[project]\nname = "a"\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    assert pytest_section("pyproject.toml", toml) != pytest_section("pyproject.toml", '[project]\nname = "a"\n')
    assert pytest_section("pyproject.toml", toml) == pytest_section("pyproject.toml", toml.replace('"a"', '"b"'))
