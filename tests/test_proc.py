"""Host harness processes: a cancelled or timed-out run leaves none of its process tree alive
(a child that left the group with setsid included), and a descendant holding the harness's
output open cannot hold the run past the harness's own end. Real processes, no Docker."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.proc import clean_env, run_host

TREE = "setsid sleep 86400 & echo $! >> {p}; sleep 86400 & echo $! >> {p}; echo $$ >> {p}; wait"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(path: Path, n: int) -> list[int]:
    while True:  # the test's timeout bounds this
        if path.exists() and len(path.read_text().split()) >= n:
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_cancel_kills_the_whole_tree(tmp_path: Path) -> None:
    pids, cancel = tmp_path / "pids", Cancel()
    threading.Thread(target=lambda: (_pids(pids, 3), cancel.set("test")), daemon=True).start()
    run = run_host(["bash", "-c", TREE.format(p=pids)], clean_env({}), str(tmp_path), 3600, cancel)
    assert (run.cancelled, run.timed_out, run.exit_code) == (True, False, None)
    assert [p for p in _pids(pids, 3) if _alive(p)] == []
    assert cancel.errors == []


@pytest.mark.timeout(60)
def test_a_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    run = run_host(["bash", "-c", "echo started; " + TREE.format(p=pids)], clean_env({}), str(tmp_path), 2)
    assert (run.timed_out, run.exit_code, run.stdout) == (True, None, "started\n")
    assert [p for p in _pids(pids, 3) if _alive(p)] == []


@pytest.mark.timeout(60)
def test_a_child_holding_the_output_does_not_hold_the_run(tmp_path: Path) -> None:
    # the child sleeps with the harness's stdout/stderr open, in a session of its own (out of
    # reach once the harness is gone); the harness exits 3 at once
    pid = tmp_path / "pid"
    run = run_host(["bash", "-c", f"setsid sleep 86400 & echo $! > {pid}; echo bye; exit 3"], clean_env({}),
                   str(tmp_path), 3600)
    assert (run.exit_code, run.stdout, run.timed_out) == (3, "bye\n", False)
    [child] = _pids(pid, 1)
    if _alive(child):  # it escaped, as documented: do not leave it behind
        psutil.Process(child).kill()


def test_a_release_that_raises_keeps_the_others() -> None:
    order: list[str] = []
    cancel = Cancel()
    cancel.on_set(lambda: order.append("first registered"))
    cancel.on_set(lambda: 1 / 0)
    cancel.on_set(lambda: order.append("last registered"))
    cancel.set("why")
    assert order == ["last registered", "first registered"] and cancel.errors == ["ZeroDivisionError: division by zero"]
    cancel.on_set(lambda: order.append("late"))  # already set: released at once
    assert order[-1] == "late" and cancel.reason == "why"
