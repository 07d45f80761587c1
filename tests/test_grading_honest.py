"""Honest work grades honestly, under pytest 7, 8 and 9, on the docker and bubblewrap backends:
the gold patch earns 1.0 and the untouched base 0.0 with exactly its FAIL_TO_PASS tests not
passing, never `tampered`. The tasks are in real projects' styles (tests/grading_corpus.py):
unittest.TestCase suites with subTest, parametrized, class-based, fixtures, xfail, a
repository whose paths say `pytest`, `py` and `pluggy`, a real project (more-itertools) and a
fixed sample of the built-in suite. Each grading run's own output names the pytest that ran
it (its session header), so each test proves which version graded.

The pytest versions come from scripts/install_grading_fixtures.sh (part of scripts/setup.sh),
mounted read-only into each sandbox and chosen through RewardConfig.runner_paths.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.gym.grading.score import score

from harnessrl.gym.grading.verdict import RewardResult
from harnessrl.gym.tasks.loaders import load_suite
from harnessrl.gym.tasks import Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_corpus import MORE_ITERTOOLS, more_itertools_task, pyplug_task  # noqa: E402
from grading_helpers import (BACKENDS, GRADING_HOME, MAJORS, backend_or_skip, mounts, pytest_that_graded,  # noqa: E402
                             require_pytests, reward_config, sdist, with_header)

# Three built-in tasks, one per project, fixed: all 32 under three versions take minutes.
BUILTIN_SAMPLE = ("harnessrl-builtin__calc-2", "harnessrl-builtin__ledger-1", "harnessrl-builtin__textkit-1")
XFAIL_AT_BASE = "tests/test_path_pytest.py::test_parent_above_a_relative_start_is_kept"


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory):
    require_pytests()
    b = backend_or_skip(request.param, "test-honest", tmp_path_factory)
    yield b
    b.reap(run_id=getattr(b, "run_id", None))


@pytest.fixture(scope="module")
def sandbox_for(backend):
    """task -> one sandbox per repository, every pytest version mounted, made on first use."""
    made = {}

    def get(task: Task):
        if task.repo not in made:
            made[task.repo] = backend.create(task.repo_spec(), mounts=mounts())
        return made[task.repo]

    yield get
    for sb in made.values():
        sb.close()


@pytest.fixture(scope="module")
def pyplug(tmp_path_factory) -> Task:
    return with_header(pyplug_task(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def more_itertools(tmp_path_factory) -> Task:
    return with_header(more_itertools_task(tmp_path_factory.mktemp("corpus"), sdist(MORE_ITERTOOLS)))


def grade(sb, task: Task, major: str, gold: bool) -> RewardResult:
    """`task` scored with pytest <major> from a reset sandbox, on its gold patch or on the base."""
    sb.reset()
    if gold:  # as `harnessrl tasks check` applies it
        sb.write_file("/tmp/harnessrl-gold.patch", task.patch.encode())
        applied = sb.exec("git apply --whitespace=nowarn /tmp/harnessrl-gold.patch && rm /tmp/harnessrl-gold.patch",
                          timeout=60)
        assert applied.exit_code == 0, applied.output
    r = score(sb, task, reward_config(major))
    graded_by = pytest_that_graded(r.test_output)
    why = f"{r.reason}\nevidence: {r.evidence}\ngraded by pytest {graded_by!r}\n{r.test_output[-2000:]}"
    assert (r.status, r.tampered) == ("ok", False), why
    assert graded_by == require_pytests()[major], why  # this pytest graded it
    return r


def assert_gold(r: RewardResult, task: Task) -> None:
    assert r.reward == 1.0, f"{r.reason}\n{r.test_output[-3000:]}"
    assert {t.node_id: t.status for t in r.tests} == dict.fromkeys([*task.FAIL_TO_PASS, *task.PASS_TO_PASS], "passed")


def assert_empty(r: RewardResult, task: Task, skipped: tuple[str, ...] = ()) -> None:
    """0.0 with exactly the FAIL_TO_PASS tests not passing: failed, or `skipped` (xfail) for those named."""
    assert r.reward == 0.0, f"{r.reason}\n{r.test_output[-3000:]}"
    not_passing = {t.node_id: t.status for t in r.tests if t.status != "passed"}
    assert not_passing == {n: "skipped" if n in skipped else "failed" for n in task.FAIL_TO_PASS}, r.test_output[-3000:]


# --- a pluggy-like library in every test style -------------------------------------------------

@pytest.mark.timeout(180)
@pytest.mark.parametrize("major", MAJORS)
def test_every_test_style_gold_earns_one(sandbox_for, pyplug, major):
    assert_gold(grade(sandbox_for(pyplug), pyplug, major, gold=True), pyplug)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("major", MAJORS)
def test_every_test_style_base_earns_zero_with_its_failing_tests_named(sandbox_for, pyplug, major):
    # NormalizeTests::test_table's failing subTests fail it under every version (pytest 9 reports
    # each subtest apart, and the test itself as passed); the xfail one is skipped, not failed.
    assert_empty(grade(sandbox_for(pyplug), pyplug, major, gold=False), pyplug, skipped=(XFAIL_AT_BASE,))


# --- a real unittest-style project: more-itertools ------------------------------------------------

@pytest.mark.timeout(180)
@pytest.mark.parametrize("major", MAJORS)
def test_real_unittest_project_gold_earns_one(sandbox_for, more_itertools, major):
    assert_gold(grade(sandbox_for(more_itertools), more_itertools, major, gold=True), more_itertools)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("major", MAJORS)
def test_real_unittest_project_base_earns_zero(sandbox_for, more_itertools, major):
    assert_empty(grade(sandbox_for(more_itertools), more_itertools, major, gold=False), more_itertools)


# --- the built-in suite's gold patches ----------------------------------------------------------------

@pytest.mark.timeout(180)
@pytest.mark.parametrize("major", MAJORS)
@pytest.mark.parametrize("instance_id", BUILTIN_SAMPLE)
def test_builtin_gold_patches_earn_one(sandbox_for, major, instance_id):
    task = with_header(next(t for t in load_suite("builtin") if t.instance_id == instance_id))
    assert_gold(grade(sandbox_for(task), task, major, gold=True), task)


def test_setup_installs_the_pytests_where_these_tests_look():
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    assert "install_grading_fixtures.sh" in (scripts / "setup.sh").read_text()
    home = subprocess.run(["bash", str(scripts / "install_grading_fixtures.sh"), "--print-home"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert Path(home) == GRADING_HOME
