"""Hidden-test rewards in real sandboxes: gold is rewarded, tampering with tests is not;
infrastructure failures (killed container, unappliable hidden tests, a test command the grader
cannot own, no report even on the pristine base) give reward None / infra_error, never 0, while
what the agent's code does (a hung test run) is its 0. JUnit parsing (used by the suite builder)
is checked on a real pytest run. More attacks: test_grading_attacks.py."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.grading.hidden_tests import nodeid_key, parse_junit

from harnessrl.gym.grading.score import score

from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.tasks.loaders import load_suite
from harnessrl.sandboxes import SandboxError, make_backend

TASKS = {t.instance_id.split("__")[1]: t for t in load_suite("builtin")}
CALC2 = TASKS["calc-2"]  # left-associative '-': 3 parametrized FAIL_TO_PASS ids, 15 PASS_TO_PASS
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "_pytest").is_dir())

# Would make every test pass if the reward ran the agent's conftest.
CHEAT_CONFTEST = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
'''


def run_plan(sb, task):
    for cmd in task.gold_plan:
        res = sb.exec(cmd, timeout=60)
        assert res.exit_code == 0, res.output


# --- JUnit <-> node ids, on a real pytest run --------------------------------------------------

def test_junit_statuses_match_collected_node_ids(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "test_mix.py").write_text('''
import pytest

class TestGroup:
    class TestInner:
        def test_deep(self):
            pass

    def test_fails(self):
        assert 1 == 2

@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")

def test_errors(broken):
    pass

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

@pytest.mark.parametrize("text", ["a b", "x::y", "1.5-[2]"])
def test_param(text):
    assert text != "x::y"
''')
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir=.", "-q"]
    collected = subprocess.run([*cmd, "--collect-only", "pkg"], cwd=tmp_path, capture_output=True, text=True, env=env)
    nodes = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(nodes) == 7
    subprocess.run([*cmd, "--junitxml=out.xml", *nodes], cwd=tmp_path, capture_output=True, env=env)
    results = parse_junit((tmp_path / "out.xml").read_bytes())
    status = {n: results[nodeid_key(n)][0] for n in nodes}
    assert status == {
        "pkg/test_mix.py::TestGroup::TestInner::test_deep": "passed",
        "pkg/test_mix.py::TestGroup::test_fails": "failed",
        "pkg/test_mix.py::test_errors": "error",
        "pkg/test_mix.py::test_skipped": "skipped",
        "pkg/test_mix.py::test_param[a b]": "passed",
        "pkg/test_mix.py::test_param[x::y]": "failed",
        "pkg/test_mix.py::test_param[1.5-[2]]": "passed",
    }
    assert "fixture exploded" in results[nodeid_key("pkg/test_mix.py::test_errors")][1]


# --- docker ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def docker_backend():
    from harnessrl.sandboxes.docker import DockerConfig
    try:
        backend = make_backend("docker", DockerConfig(run_id=f"test-rewards-{uuid.uuid4().hex[:8]}"))
    except Exception as e:  # SandboxUnavailable: no engine here
        pytest.skip(f"docker backend unavailable here: {e}")
    yield backend
    backend.reap(run_id=backend.run_id)


@pytest.fixture
def sb(docker_backend):
    sandbox = docker_backend.create(CALC2.repo_spec())
    yield sandbox
    sandbox.close()


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_gold_plan_is_rewarded_with_per_test_detail(sb):
    run_plan(sb, CALC2)
    r = score(sb, CALC2)
    assert (r.reward, r.status, r.head_moved) == (1.0, "ok", False)
    assert r.agent_diff == CALC2.patch
    assert [t.node_id for t in r.tests] == CALC2.FAIL_TO_PASS + CALC2.PASS_TO_PASS
    assert {t.status for t in r.tests} == {"passed"}
    assert r.reason == f"all {len(r.tests)} tests pass"


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_hidden_tests_run_in_a_fork_of_the_warm_init_and_score_as_in_a_new_interpreter(docker_backend):
    """DockerConfig.warm_python: the runner forks from PID 1's warm python instead of starting
    one; the verdict, test by test with its messages, is the one a new interpreter gives."""
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig
    cold = DockerBackend(DockerConfig(run_id=docker_backend.run_id, warm_python=()))
    got = {}
    for kind, backend in (("warm", docker_backend), ("cold", cold)):
        sandbox = backend.create(CALC2.repo_spec())
        try:
            r = score(sandbox, CALC2)
            got[kind] = (r.reward, r.reason, [(t.node_id, t.status, t.message) for t in r.tests], sandbox.warm_runs)
        finally:
            sandbox.close()
    assert got["warm"][:3] == got["cold"][:3]
    assert got["warm"][0] == 0.0 and any(status == "failed" and msg for _, status, msg in got["warm"][2])
    assert (got["warm"][3], got["cold"][3]) == (1, 0)


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_untouched_repo_scores_zero_with_failing_tests_named(sb):
    r = score(sb, CALC2)
    assert (r.reward, r.status, r.agent_diff) == (0.0, "ok", "")
    by_kind = {t.node_id: (t.kind, t.status) for t in r.tests}
    assert all(by_kind[n] == ("FAIL_TO_PASS", "failed") for n in CALC2.FAIL_TO_PASS)
    assert all(by_kind[n] == ("PASS_TO_PASS", "passed") for n in CALC2.PASS_TO_PASS)
    assert "3 of 18 tests not passing" in r.reason


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_hidden_tests_arrive_only_at_scoring(sb):
    hidden = "test_additive_operators_are_left_associative"
    assert sb.exec(f"grep -rq {hidden} . /tmp", timeout=30).exit_code == 1
    assert sb.exec("git rev-list --all | wc -l", timeout=30).output.strip() == "1"
    score(sb, CALC2)
    assert hidden in sb.read_file("tests/test_calc.py").decode()
    sb.reset()
    assert hidden not in sb.read_file("tests/test_calc.py").decode()


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_editing_tests_is_not_rewarded(sb):
    # 1. A conftest that forces every test to pass: it works when run directly...
    sb.write_file("conftest.py", CHEAT_CONFTEST.encode())
    sb.write_file("tests/test_calc.py", b"def test_additive_operators_are_left_associative():\n    pass\n")
    direct = sb.exec("python3 -m pytest -q -p no:cacheprovider tests/test_calc.py", timeout=60)
    assert direct.exit_code == 0, direct.output
    # ...but scoring restores test files and drops the conftest first.
    r = score(sb, CALC2)
    assert (r.reward, r.status) == (0.0, "ok")
    assert set(r.restored_files) == {"conftest.py", "tests/test_calc.py"}
    assert {t.status for t in r.tests if t.kind == "FAIL_TO_PASS"} == {"failed"}
    assert "cheat" not in r.agent_diff and "conftest.py" in r.agent_diff  # the record keeps what the agent did


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_real_fix_plus_own_tests_still_rewarded(sb):
    run_plan(sb, CALC2)
    sb.write_file("tests/test_mine.py", b"def test_mine():\n    assert False\n")
    r = score(sb, CALC2)
    assert r.reward == 1.0 and r.restored_files == ["tests/test_mine.py"]


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_agent_commits_are_scored_against_base(sb):
    run_plan(sb, CALC2)
    assert sb.exec("git commit -qam 'fix subtraction'", timeout=30).exit_code == 0
    r = score(sb, CALC2)
    assert (r.reward, r.head_moved) == (1.0, True)
    assert r.agent_diff == CALC2.patch


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_broken_code_is_a_zero_not_an_infra_error(sb):
    # The agent's syntax error stops collection: its own failure, so reward 0.0, status ok.
    sb.write_file("calc/parser.py", b"def broken(:\n")
    r = score(sb, CALC2)
    assert (r.reward, r.status) == (0.0, "ok")
    assert {t.status for t in r.tests} <= {"missing", "error"}


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_killed_sandbox_is_infra_error(docker_backend, sb):
    run_plan(sb, CALC2)
    docker_backend.client.api.kill(sb.id)  # mid-episode, from outside: an OOM kill or a crash
    r = score(sb, CALC2)
    assert (r.reward, r.status) == (None, "infra_error")
    assert "not alive" in r.reason or "SandboxDied" in r.reason


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_test_run_timeout_is_the_agents_zero(sb):
    # The package import hangs, so the hidden test run never finishes: the agent's code did it.
    assert sb.exec("echo 'import time; time.sleep(600)' >> calc/__init__.py", timeout=30).exit_code == 0
    r = score(sb, CALC2, RewardConfig(test_timeout_s=5))
    assert (r.reward, r.status, r.cause, r.tampered) == (0.0, "ok", "agent", False)
    assert r.reason == "hidden test run timed out after 5s (before any test started)"


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_foreign_test_command_and_unappliable_hidden_tests_are_infra_errors(sb):
    r = score(sb, CALC2.model_copy(update={"test_command": "true"}))
    assert (r.reward, r.status, r.cause) == (None, "infra_error", "infra")
    assert "is not a pytest invocation the grader can run" in r.reason
    # Context lines that match nothing at base: the hidden tests cannot be applied.
    bad_patch = CALC2.test_patch.replace('     assert calc.run("rate * 10") == 5', '     assert calc.run("rate") == 0')
    assert bad_patch != CALC2.test_patch
    r = score(sb, CALC2.model_copy(update={"test_patch": bad_patch}))
    assert (r.reward, r.status) == (None, "infra_error")
    assert r.reason.startswith("restoring test files and applying the hidden tests failed (exit 3)")
    assert "hidden test patch did not apply" in r.reason


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_no_report_on_the_pristine_base_either_is_infra(sb):
    # A runner argument pytest rejects: no session at all, with or without the agent's diff.
    run_plan(sb, CALC2)
    r = score(sb, CALC2.model_copy(update={"test_command": "python3 -m pytest --no-such-option"}))
    assert (r.reward, r.status, r.cause) == (None, "infra_error", "infra")
    assert "the pristine base gives none either" in r.reason


class FlakyReset:
    """A real sandbox whose first reset fails the way a broken control channel does."""

    def __init__(self, inner):
        self.inner, self.workdir, self.resets = inner, inner.workdir, 0

    def reset(self):
        self.resets += 1
        if self.resets == 1:
            raise SandboxError("reset failed: ConnectionError: attach stream closed")
        self.inner.reset()

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_a_transient_reset_failure_is_retried_not_scored(sb):
    run_plan(sb, CALC2)
    flaky = FlakyReset(sb)
    r = score(flaky, CALC2)
    assert (r.reward, r.status, flaky.resets) == (1.0, "ok", 2), r.reason


# --- local (bubblewrap) backend ----------------------------------------------------------------

@pytest.mark.bwrap
@pytest.mark.timeout(300)
def test_local_backend_scores_the_same(tmp_path):
    from harnessrl.sandboxes.local import LocalConfig
    try:
        backend = make_backend("local", LocalConfig(root=str(tmp_path / "local")))
    except Exception as e:
        pytest.skip(f"local backend unavailable here: {e}")
    # The host's python3 has no pytest: lend it this venv's, read-only.
    sb = backend.create(CALC2.repo_spec(), mounts=[(SITE, "/opt/pytest-site", True)],
                        env={"PYTHONPATH": "/opt/pytest-site", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    try:
        r = score(sb, CALC2)
        assert (r.reward, r.status) == (0.0, "ok"), r.reason
        sb.write_file("conftest.py", CHEAT_CONFTEST.encode())
        assert score(sb, CALC2).reward == 0.0
        sb.reset()
        run_plan(sb, CALC2)
        r = score(sb, CALC2)
        assert (r.reward, r.status, r.agent_diff) == (1.0, "ok", CALC2.patch)
    finally:
        sb.close()
