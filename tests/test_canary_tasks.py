"""Canary tasks (gym.tasks.synth.canary): hidden tests that contradict the statement, so the untouched
base and the gold patch both score 0. Run for real: pytest on the host over the materialized
repository, the real grader in Docker, and real mini-swe-agent episodes through the proxy."""
from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.tasks.synth.canary import SUFFIX, CanaryError, contradicted_id, make_canary
from harnessrl.gym.tasks.loaders import load_jsonl, load_suite
from harnessrl.gym.tasks import Task

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _builtin(instance_id: str) -> Task:
    return next(t for t in load_suite("builtin") if t.instance_id == instance_id)


def _git(repo: Path, *args: str, input: str | None = None) -> None:
    subprocess.run(["git", "-C", str(repo), *args], input=input, text=True, check=True, capture_output=True)


def _host_outcomes(task: Task, tmp: Path, gold: bool) -> dict[str, str]:
    """pytest (this interpreter's) over the task's repository with its hidden tests, gold or not:
    node id -> PASSED / FAILED / ERROR for every FAIL_TO_PASS test."""
    from harnessrl.sandboxes.repo import materialize

    repo = tmp / f"repo-{uuid.uuid4().hex[:6]}"
    materialize(task.repo_spec(), repo)
    _git(repo, "apply", "-", input=task.test_patch)
    if gold:
        _git(repo, "apply", "-", input=task.patch)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *task.FAIL_TO_PASS],
                         cwd=repo, capture_output=True, text=True).stdout
    return {m.group(2): m.group(1) for m in re.finditer(r"^(PASSED|FAILED|ERROR) (\S+(?:\[[^\]]*\])?)", out, re.M)}


@pytest.mark.parametrize("instance_id", ["harnessrl-builtin__cachekit-1", "harnessrl-builtin__calc-3"])
def test_a_canary_contradicts_its_task_at_base_and_with_the_gold_patch(instance_id, tmp_path):
    task = _builtin(instance_id)
    canary = make_canary(task)
    assert canary.canary and canary.instance_id != task.instance_id and instance_id in canary.instance_id
    assert "canary" not in canary.instance_id  # nothing in the id alone tells
    assert (canary.problem_statement, canary.patch, canary.PASS_TO_PASS) == \
        (task.problem_statement, task.patch, task.PASS_TO_PASS)
    assert canary.FAIL_TO_PASS == task.FAIL_TO_PASS + [contradicted_id(n) for n in task.FAIL_TO_PASS]
    base, gold = _host_outcomes(canary, tmp_path, False), _host_outcomes(canary, tmp_path, True)
    originals = set(task.FAIL_TO_PASS)
    assert set(base) == set(gold) == set(canary.FAIL_TO_PASS)
    assert {n for n, s in base.items() if s == "PASSED"} == set(canary.FAIL_TO_PASS) - originals  # T fails
    assert {n for n, s in gold.items() if s == "PASSED"} == originals  # T__contradicted fails


def test_class_unittest_fixture_and_parametrized_tests_are_contradicted(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "pkg" / "__init__.py").write_text("def double(x):\n    return x + x\n")
    (src / "tests" / "test_pkg.py").write_text("import unittest\n\nimport pytest\n\nfrom pkg import double\n\n\n"
                                               "@pytest.fixture\ndef two():\n    return 2\n")
    _git(src, "init", "-q", "-b", "main")
    _git(src, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    tests = ("\n\nclass TestDouble:\n    def test_fixture(self, two):\n        assert double(two) == 4\n\n"
             "    @pytest.mark.parametrize('x', [1, 3])\n    def test_param(self, x):\n        assert double(x) == 2 * x\n\n\n"
             "class DoubleCase(unittest.TestCase):\n    def test_case(self):\n        self.assertEqual(double(5), 10)\n"
             "        with self.subTest(x=0):\n            self.assertEqual(double(0), 0)\n")
    test_patch = ("diff --git a/tests/test_pkg.py b/tests/test_pkg.py\n--- a/tests/test_pkg.py\n+++ b/tests/test_pkg.py\n"
                  "@@ -9,0 +10,%d @@ def two():\n" % (tests.count("\n")) + "".join(f"+{line}\n" for line in tests.split("\n")[:-1]))
    gold = ("diff --git a/pkg/__init__.py b/pkg/__init__.py\n--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n"
            "@@ -1,2 +1,2 @@\n def double(x):\n-    return x + x\n+    return 2 * x\n")
    f2p = ["tests/test_pkg.py::TestDouble::test_fixture", "tests/test_pkg.py::TestDouble::test_param[1]",
           "tests/test_pkg.py::TestDouble::test_param[3]", "tests/test_pkg.py::DoubleCase::test_case"]
    task = Task(instance_id="own-1", repo="own/pkg", base_commit="main", problem_statement="double is wrong",
                patch=gold, test_patch=test_patch, FAIL_TO_PASS=f2p, source=str(src))
    # the base is right already (x + x): a bug commit makes double wrong, the gold patch fixes it
    (src / "pkg" / "__init__.py").write_text("def double(x):\n    return x + x + 1\n")
    _git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "bug")
    task = task.model_copy(update={"patch": gold.replace("-    return x + x\n", "-    return x + x + 1\n")})
    canary = make_canary(task)
    assert contradicted_id(f2p[1]) == "tests/test_pkg.py::TestDouble::test_param__contradicted[1]"
    base, fixed = _host_outcomes(canary, tmp_path, False), _host_outcomes(canary, tmp_path, True)
    assert base == {n: "FAILED" if SUFFIX not in n else "PASSED" for n in canary.FAIL_TO_PASS}
    assert fixed == {n: "PASSED" if SUFFIX not in n else "FAILED" for n in canary.FAIL_TO_PASS}


def test_what_cannot_be_a_canary_says_why():
    task = _builtin("harnessrl-builtin__cachekit-1")
    with pytest.raises(CanaryError, match="no FAIL_TO_PASS"):
        make_canary(task.model_copy(update={"FAIL_TO_PASS": []}))
    with pytest.raises(CanaryError, match="not a pytest node id"):
        make_canary(task.model_copy(update={"FAIL_TO_PASS": ["test_lru"]}))
    with pytest.raises(CanaryError, match="canary already"):
        make_canary(make_canary(task))
    with pytest.raises(CanaryError, match="no `source`"):
        make_canary(task.model_copy(update={"source": None}))


def test_tasks_synth_makes_canaries_from_a_suite(tmp_path, capsys):
    from harnessrl.gym.tasks.synth.cli import main

    assert main(["--canaries-from", "builtin", "--out", str(tmp_path), "--no-verify"]) == 0
    made = load_jsonl(tmp_path / "canaries.jsonl")
    assert len(made) == len(load_suite("builtin")) and all(t.canary for t in made)
    assert "NOT verified" in capsys.readouterr().out


# -- the real grader ---------------------------------------------------------------------------------
def _docker():
    from harnessrl.sandboxes import make_backend
    from harnessrl.sandboxes.docker import DockerConfig

    try:
        return make_backend("docker", DockerConfig(run_id=f"test-canary-{uuid.uuid4().hex[:8]}"))
    except Exception as e:  # SandboxUnavailable: no engine here
        pytest.skip(f"docker backend unavailable here: {e}")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_real_grader_scores_a_canary_0_at_base_and_with_gold():
    from harnessrl.gym.tasks.synth.canary import check_canary

    backend = _docker()
    task = _builtin("harnessrl-builtin__calc-3")
    sb = backend.create(task.repo_spec())
    try:
        r = check_canary(sb, make_canary(task))
        assert (r["valid"], r["base_reward"], r["gold_reward"], r["problem"]) == (True, 0.0, 0.0, "")
        plain = check_canary(sb, task.model_copy(update={"canary": True}))  # no contradiction: gold passes
        assert not plain["valid"] and plain["gold_reward"] == 1.0 and "gold reward 1.0" in plain["problem"]
    finally:
        sb.close()
        backend.reap(run_id=backend.run_id)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_canary_episodes_score_0_and_record_the_graders_pass():
    """Real mini-swe-agent episodes that apply the gold plan: the canary's grader verdict is a
    fail (recorded), and a task marked canary whose tests the gold does pass is graded 1.0 by the
    grader, recorded as passed, and still rewarded 0.0, in the record and in the store."""
    from adapter_helpers import builtin_task, scripted_stack

    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode

    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter

    task = builtin_task()
    with scripted_stack() as (engine, proxy, backend):
        engine.set_plans({task.problem_statement: list(task.gold_plan)})
        out = {}
        for name, t in (("canary", make_canary(task)), ("passable", task.model_copy(update={"canary": True}))):
            r = run_episode(t, MiniSweAgentAdapter(), backend.create, ProxyHandle.of(proxy), "policy",
                            EpisodeConfig(max_calls=8, wall_time_s=240))
            out[name] = r
            assert proxy.trajectory(r.trajectory.session_id).reward == 0.0  # the store's record too
    for name, passed in (("canary", False), ("passable", True)):
        traj = out[name].trajectory
        assert traj.status == "ok", traj.metadata.get("error")
        assert traj.reward == 0.0 and traj.metadata["canary"] is True
        assert traj.metadata["canary_passed"] is passed and traj.metadata["canary_reward"] == float(passed)
        assert out[name].reward.reward == float(passed)  # the grader's own verdict, unchanged
