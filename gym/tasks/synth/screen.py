"""Pre-screen on the host: run a repository's tests on its working tree, one fresh process per run.

Contract: `Screener(repo, test_command)` imports pytest once; every `run()` forks a child
that imports the repository's code afresh, runs pytest in-process with the test command's
arguments (plugin autoloading off, no cache provider, no bytecode written, so an edit of the
same size within one second is never hidden by a stale .pyc), records each node id's
outcome and first failure line from `pytest_runtest_logreport`, and hands them back through
a file. A run past `timeout_s` is killed (`Run.timed_out`), a child that leaves no report
(crash, os._exit in the code under test) is `Run.crashed`. Forking skips interpreter start-up
and pytest's import (most of a subprocess run's time on small projects); a child runs under
an address-space limit so a mutant that allocates without bound dies instead of the host.
`classify(base, run)` turns a mutant's run into (FAIL_TO_PASS, PASS_TO_PASS, reject reason).
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.gym.grading.hidden_tests import runner_command

__all__ = ["Run", "Screener", "classify"]
_WORST = ("error", "failed", "skipped", "passed")


def _vm_bytes() -> int:
    """This process's address-space size (VmSize), 0 where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass
class Run:
    """What one test run on the host found."""

    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    """node id -> (status: passed | failed | error | skipped, first line of the failure)."""
    timed_out: bool = False
    crashed: bool = False
    seconds: float = 0.0


class _Recorder:
    """pytest plugin: node id -> worst (status, message) over setup / call / teardown."""

    def __init__(self, root: str) -> None:
        self.results: dict[str, tuple[str, str]] = {}
        self.root = root.rstrip("/") + "/"

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 (pytest's hook)
        if report.passed:
            status = "passed"
        elif report.skipped:
            status = "skipped"
        else:
            status = "failed" if report.when == "call" else "error"
        message = ""
        if status in ("failed", "error"):
            crash = getattr(report.longrepr, "reprcrash", None)
            message = (getattr(crash, "message", "") or str(report.longrepr or "")).strip().split("\n")[0]
            # Same text on every run: no object addresses, no temporary checkout paths.
            message = re.sub(r" at 0x[0-9a-fA-F]+", "", message.replace(self.root, ""))[:300]
        prev = self.results.get(report.nodeid)
        if prev is None or _WORST.index(status) < _WORST.index(prev[0]):
            self.results[report.nodeid] = (status, message)


class Screener:
    """Runs the tests of the tree at `repo` (edited in place between runs by the caller)."""

    def __init__(self, repo: Path, test_command: str, timeout_s: float = 60.0, memory_bytes: int = 2 << 30):
        import pytest  # noqa: F401  imported before any fork, so children start with it

        _, args, env = runner_command(test_command)
        self.repo, self.args, self.env = Path(repo).resolve(), args, env
        self.timeout_s, self.memory_bytes = timeout_s, memory_bytes

    def run(self) -> Run:
        with tempfile.NamedTemporaryFile(prefix="harnessrl-screen-", suffix=".json", delete=False) as f:
            out_path = f.name
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(out_path)
        run = Run()
        deadline = started + self.timeout_s
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                run.timed_out = True
                break
            time.sleep(0.01)
        run.seconds = time.monotonic() - started
        try:
            text = Path(out_path).read_text()
            if not run.timed_out:
                run.results = {k: (v[0], v[1]) for k, v in json.loads(text).items()} if text else {}
                run.crashed = not text
        except (OSError, ValueError):
            run.crashed = not run.timed_out
        finally:
            Path(out_path).unlink(missing_ok=True)
        return run

    def _child(self, out_path: str) -> None:
        code = 0
        try:
            import resource

            import pytest

            # The limit is on top of what the child starts with: a forked child inherits its
            # parent's address space (a test process that imported torch and jax is past 2 GiB
            # already), and an absolute limit below that would fail every allocation.
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = _vm_bytes() + self.memory_bytes
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
            os.setpgid(0, 0)
            # Dies on its own past the limit even if the parent is gone (killed mid-run).
            signal.alarm(int(self.timeout_s) + 5)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (a caller's capture may own them)
            os.chdir(self.repo)
            os.environ.update({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", **self.env})
            sys.dont_write_bytecode = True
            sys.path.insert(0, str(self.repo))
            recorder = _Recorder(str(self.repo))
            pytest.main([*self.args, "-p", "no:cacheprovider", "-p", "no:randomly"], plugins=[recorder])
            with open(out_path, "w") as f:
                json.dump(recorder.results, f)
        except BaseException:  # noqa: BLE001  an empty report tells the parent it crashed
            code = 1
        finally:
            os._exit(code)


def classify(base: Run, run: Run) -> tuple[list[str], list[str], str]:
    """(FAIL_TO_PASS, PASS_TO_PASS, reason): the tests that passed at the clean commit and do
    not under the mutant, those that still pass, and why the mutant is rejected ("" = kept).
    A mutant must fail some tests and leave others passing, as in SWE-bench. A test the
    mutant's run never reported (its module no longer imports or collects) counts as failing,
    so a mutant that breaks one test module's import is kept while other tests pass."""
    if run.timed_out:
        return [], [], "timeout"
    if run.crashed:
        return [], [], "crashed"
    passing = sorted(n for n, (s, _) in base.results.items() if s == "passed")
    f2p = [n for n in passing if run.results.get(n, ("missing", ""))[0] != "passed"]
    p2p = [n for n in passing if run.results.get(n, ("missing", ""))[0] == "passed"]
    if not f2p:
        return [], [], "equivalent"
    if not p2p:
        return [], [], "breaks_all"
    return f2p, p2p, ""
