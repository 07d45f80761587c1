"""Every built-in task in a real docker sandbox: at base FAIL_TO_PASS fail and PASS_TO_PASS
pass (reward 0.0); the gold plan, run through sandbox.exec, reproduces the gold patch exactly
and earns 1.0 (FAIL_TO_PASS and PASS_TO_PASS all pass). One sandbox per project serves all of
its tasks through reset(), as a warm pool would. A few tasks also run on the local backend."""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from harnessrl.gym.grading.score import score
from harnessrl.gym.tasks.loaders import load_suite
from harnessrl.sandboxes import make_backend

TASKS = load_suite("builtin")
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "_pytest").is_dir())


def check_task(sb, task):
    sb.reset()
    base = score(sb, task)
    assert (base.reward, base.status) == (0.0, "ok"), base.reason
    status = {t.node_id: t.status for t in base.tests}
    assert all(status[n] in ("failed", "error") for n in task.FAIL_TO_PASS), status
    assert all(status[n] == "passed" for n in task.PASS_TO_PASS), status

    sb.reset()
    for cmd in task.gold_plan:
        res = sb.exec(cmd, timeout=60)
        assert res.exit_code == 0, res.output
    assert sb.diff() == task.patch  # the plan is the gold patch, byte for byte
    gold = score(sb, task)
    assert (gold.reward, gold.status) == (1.0, "ok"), (gold.reason, gold.test_output)
    assert len(gold.tests) == len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS)


@pytest.fixture(scope="module")
def sandboxes():
    """repo -> one docker sandbox, created on first use, closed at the end."""
    from harnessrl.sandboxes.docker import DockerConfig
    try:
        backend = make_backend("docker", DockerConfig(run_id=f"test-builtin-{uuid.uuid4().hex[:8]}"))
    except Exception as e:  # SandboxUnavailable: no engine here
        pytest.skip(f"docker backend unavailable here: {e}")
    boxes: dict[str, object] = {}

    def get(task):
        if task.repo not in boxes:
            boxes[task.repo] = backend.create(task.repo_spec())
        return boxes[task.repo]

    yield get
    for sb in boxes.values():
        sb.close()
    backend.reap(run_id=backend.run_id)


@pytest.mark.docker
@pytest.mark.timeout(120)
@pytest.mark.parametrize("task", TASKS, ids=[t.instance_id.split("__")[1] for t in TASKS])
def test_builtin_task_in_docker(sandboxes, task):
    check_task(sandboxes(task), task)


FIRST_OF_EACH = list({t.repo: t for t in reversed(TASKS)}.values())


@pytest.mark.bwrap
@pytest.mark.timeout(180)
@pytest.mark.parametrize("task", FIRST_OF_EACH, ids=[t.instance_id.split("__")[1] for t in FIRST_OF_EACH])
def test_builtin_task_on_local_backend(tmp_path_factory, task):
    from harnessrl.sandboxes.local import LocalConfig
    try:
        backend = make_backend("local", LocalConfig(root=str(tmp_path_factory.mktemp("local"))))
    except Exception as e:
        pytest.skip(f"local backend unavailable here: {e}")
    # The host's python3 has no pytest: lend it this venv's, read-only.
    sb = backend.create(task.repo_spec(), mounts=[(SITE, "/opt/pytest-site", True)],
                        env={"PYTHONPATH": "/opt/pytest-site", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    try:
        check_task(sb, task)
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_check_suite_tells_valid_from_invalid_tasks():
    from harnessrl.gym.tasks.suites.check import check_suite
    from harnessrl.sandboxes.docker import DockerConfig
    try:
        backend = make_backend("docker", DockerConfig(run_id=f"test-check-{uuid.uuid4().hex[:8]}"))
    except Exception as e:
        pytest.skip(f"docker backend unavailable here: {e}")
    good = next(t for t in TASKS if t.instance_id.endswith("calc-4"))
    mislabelled = good.model_copy(update={"instance_id": "mislabelled", "FAIL_TO_PASS": good.PASS_TO_PASS[:1]})
    broken_gold = good.model_copy(update={"instance_id": "broken-gold",
                                          "patch": good.patch.replace("def error(self, message):", "def err(self):")})
    try:
        results = {r["instance_id"]: r for r in check_suite([good, mislabelled, broken_gold], backend)}
    finally:
        backend.reap(run_id=backend.run_id)
    assert results[good.instance_id].pop("seconds") > 0
    assert results[good.instance_id] == {"instance_id": good.instance_id, "valid": True, "problem": "",
                                         "base_reward": 0.0, "gold_reward": 1.0}
    assert not results["mislabelled"]["valid"]
    assert results["mislabelled"]["problem"].startswith("FAIL_TO_PASS already passing at base")
    assert not results["broken-gold"]["valid"]
    assert results["broken-gold"]["problem"].startswith("gold patch does not apply")


class _BugBackend:
    """A backend with bugs nobody foresaw: creating calc's sandbox raises, and cachekit's
    sandbox raises inside the check and again when closed."""

    name = "bugs"

    def create(self, spec):
        if spec.repo_id.endswith("calc"):
            raise RuntimeError("backend bug\nwith a second line")
        return _BugSandbox()


class _BugSandbox:
    def reset(self):
        raise KeyError("boom")

    def close(self):
        raise OSError("close failed")


def test_check_suite_reports_unexpected_errors_as_one_line_per_task(capsys):
    """No exception escapes a suite check: each task it hits is one INVALID line naming it, and
    every other task is still checked."""
    from harnessrl.gym.tasks.suites.check import _line, check_suite

    tasks = [next(t for t in TASKS if t.repo.endswith(r)) for r in ("calc", "cachekit")]
    results = {r["instance_id"]: r for r in check_suite(tasks, _BugBackend())}
    calc, cache = results[tasks[0].instance_id], results[tasks[1].instance_id]
    assert (calc["valid"], calc["problem"]) == (False, "check failed: no sandbox: RuntimeError: backend bug\n"
                                                       "with a second line")
    assert (cache["valid"], cache["problem"]) == (False, "check failed: KeyError: 'boom'")
    assert "close failed" in capsys.readouterr().err
    line = _line(calc)
    assert "\n" not in line and line.endswith("check failed: no sandbox: RuntimeError: backend bug with a second line")
