"""The pytest versions the grader is tested under, lent to sandboxes read-only.

scripts/install_grading_fixtures.sh (run by scripts/setup.sh) makes the layout read here:
${HARNESSRL_HOME:-~/.cache/harnessrl}/grading/pytest/<major>/ (pytest and its dependencies,
stamped with its pip spec) and grading/sdist/<file> (real projects' source releases). A
sandbox gets every version mounted at /opt/pytest-<major>; `reward_config(major)` names one
in `RewardConfig.runner_paths`, which the grader puts ahead of the sandbox's own pytest.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from harnessrl.gym.grading.attack_tasks import open_backend
from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.tasks import Task

MAJORS = ("7", "8", "9")
GRADING_HOME = Path(os.environ.get("HARNESSRL_HOME") or os.path.expanduser("~/.cache/harnessrl")) / "grading"
INSTALL = "bash scripts/install_grading_fixtures.sh"


def pytest_dir(major: str) -> Path:
    return GRADING_HOME / "pytest" / major


def pytest_version(major: str) -> str | None:
    """The installed pytest <major>'s exact version ("9.2.0"), None when not installed."""
    stamp = pytest_dir(major) / ".harnessrl-installed"
    return stamp.read_text().strip().split("==", 1)[1] if stamp.is_file() else None


def require_pytests() -> dict[str, str]:
    """major -> exact version of every lent pytest; skips (saying how to install) when one is missing."""
    versions = {m: pytest_version(m) for m in MAJORS}
    missing = [m for m, v in versions.items() if v is None]
    if missing:
        pytest.skip(f"pytest {', '.join(missing)} not installed under {GRADING_HOME}/pytest (run {INSTALL})")
    return versions  # type: ignore[return-value]


def sdist(filename: str) -> Path:
    """A cached source release; skips (saying how to get it) when it is not there."""
    path = GRADING_HOME / "sdist" / filename
    if not path.is_file():
        pytest.skip(f"{path} not downloaded (run {INSTALL})")
    return path


def mounts() -> list[tuple[str, str, bool]]:
    """Every pytest version, read-only, at /opt/pytest-<major> (sandbox create(mounts=...))."""
    return [(str(pytest_dir(m)), f"/opt/pytest-{m}", True) for m in MAJORS]


def reward_config(major: str) -> RewardConfig:
    """Grade with pytest <major>; the whole output kept so its session header shows which pytest ran."""
    return RewardConfig(runner_paths=[f"/opt/pytest-{major}"], output_tail_chars=1_000_000, test_timeout_s=120)


def with_header(task: Task) -> Task:
    """`task` with its pytest command minus -q/--quiet, so pytest prints its session header
    ("platform linux -- Python 3.11.2, pytest-9.2.0, pluggy-...")."""
    command = re.sub(r"\s(-q|--quiet)(?=\s|$)", "", task.test_command)
    return task.model_copy(update={"test_command": command})


def pytest_that_graded(test_output: str) -> str:
    """The version in pytest's session header of a grading run, "" when it printed none."""
    found = re.search(r"^platform \S+ -- Python \S+, pytest-([^,\s]+),", test_output, flags=re.M)
    return found.group(1) if found else ""


#: The two grading backends, each test marked for what it needs.
BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)]


def backend_or_skip(name: str, label: str, tmp_path_factory):
    """A grading backend in its default config (docker's warm python included: PID 1 has the
    image's own pytest), or the test skipped naming why it cannot run here."""
    try:
        return open_backend(name, label, str(tmp_path_factory.mktemp("local")))
    except Exception as e:  # SandboxUnavailable: no engine / no bubblewrap here
        pytest.skip(f"{name} backend unavailable here: {e}")
