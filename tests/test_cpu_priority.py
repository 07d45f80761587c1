"""The environment yields the CPU to the engine (sandboxes.limits.yield_cpu): harness processes,
launched plainly or from a fork server, run at a nice value `HARNESSRL_ENV_NICE` (10) above
harnessrl's, in a session whose scheduler group has that nice too; the local sandboxes' commands
get the nice value; 0 turns it off. Read from inside the real processes (/proc/self/autogroup, getpriority)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.adapters import prefork
from harnessrl.adapters.prefork import Prefork
from harnessrl.adapters.proc import clean_env, run_host
from harnessrl.sandboxes.limits import env_nice, sandbox_nice, yield_cpu

PROBE = """
import json, os
try:
    group = open("/proc/self/autogroup").read().split()[-1]
except OSError:
    group = None
print(json.dumps({"nice": os.getpriority(os.PRIO_PROCESS, 0), "group": group, "leader": os.getsid(0) == os.getpid()}))
"""
AUTOGROUP = os.path.exists("/proc/self/autogroup")


@pytest.fixture(autouse=True)
def defaults(monkeypatch):
    """These tests check the defaults: the suite's conftest sets both variables to 0."""
    for var in ("HARNESSRL_ENV_NICE", "HARNESSRL_SANDBOX_NICE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_PREFORK", "1")
    s = tmp_path / "probe"
    s.write_text(f"#!{sys.executable}\n{PROBE}")
    s.chmod(0o755)
    yield s
    prefork.close_all()


def _launch(script, tmp_path, forked: bool) -> dict:
    run = run_host([str(script)], clean_env({"HOME": str(tmp_path)}), str(tmp_path), 60,
                   prefork=Prefork(("json",), ("HOME",)) if forked else None)
    assert run.exit_code == 0 and run.launch == ("forked" if forked else "plain"), (run.launch, run.stderr)
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("forked", [False, True], ids=["plain", "forked"])
def test_harness_processes_run_below_harnessrl_and_env_nice_zero_keeps_them_level(script, tmp_path, monkeypatch, forked):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine >= 9:
        pytest.skip(f"this test runs at nice {mine}: there is no room below it to see")
    got = _launch(script, tmp_path, forked)
    assert got == {"nice": mine + 10, "group": "10" if AUTOGROUP else None, "leader": True}
    prefork.close_all()
    monkeypatch.setenv("HARNESSRL_ENV_NICE", "3")
    assert _launch(script, tmp_path, forked)["nice"] == mine + 3
    prefork.close_all()
    monkeypatch.setenv("HARNESSRL_ENV_NICE", "0")
    assert _launch(script, tmp_path, forked) == {"nice": mine, "group": "0" if AUTOGROUP else None, "leader": True}


def test_env_nice_is_validated_and_yield_cpu_refuses_a_process_sharing_its_session(monkeypatch):
    for bad in ("ten", "-1", "20"):
        monkeypatch.setenv("HARNESSRL_ENV_NICE", bad)
        with pytest.raises(ValueError, match="HARNESSRL_ENV_NICE must be an integer 0-19"):
            env_nice()
    monkeypatch.delenv("HARNESSRL_ENV_NICE")
    assert env_nice() == 10
    assert sandbox_nice() == 10  # the harnesses' unless set apart
    monkeypatch.setenv("HARNESSRL_ENV_NICE", "4")
    assert sandbox_nice() == 4
    monkeypatch.setenv("HARNESSRL_SANDBOX_NICE", "0")
    assert (sandbox_nice(), env_nice()) == (0, 4)
    for bad in ("x", "-2", "20"):
        monkeypatch.setenv("HARNESSRL_SANDBOX_NICE", bad)
        with pytest.raises(ValueError, match="HARNESSRL_SANDBOX_NICE must be an integer 0-19"):
            sandbox_nice()
    monkeypatch.delenv("HARNESSRL_SANDBOX_NICE")
    monkeypatch.delenv("HARNESSRL_ENV_NICE")
    # A child in our session: lowering its group's priority would lower ours; refused, untouched.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ValueError, match="does not lead its own session"):
            yield_cpu(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        child.kill()
        child.wait()


def _one_commit_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository of one file and one commit: (its folder, the commit's sha)."""
    src = tmp_path / "src"
    src.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    (src / "a.txt").write_text("a\n")
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *argv], cwd=src, env=env, check=True, capture_output=True)
    return src, subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip()


@pytest.mark.bwrap
def test_local_sandbox_commands_run_below_harnessrl(tmp_path, monkeypatch):
    from harnessrl.sandboxes import RepoSpec, SandboxError
    from harnessrl.sandboxes.local import LocalBackend, LocalConfig

    src, sha = _one_commit_repo(tmp_path)
    try:
        backend = LocalBackend(LocalConfig(root=str(tmp_path / "root")))
    except SandboxError as e:
        pytest.skip(f"local backend unavailable here: {e}")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    sb = backend.create(RepoSpec("prio", str(src), sha))
    try:
        # The nice value only: bwrap's --new-session gives the command a session group of its own
        # at group nice 0 (see sandboxes/local.py).
        r = sb.exec(["bash", "-c", "nice; sh -c nice"], timeout=30)
        assert r.exit_code == 0, r.output
        assert r.output.split() == [str(min(19, mine + 10))] * 2
        monkeypatch.setenv("HARNESSRL_ENV_NICE", "0")
        assert sb.exec(["bash", "-c", "nice"], timeout=30).output.split() == [str(mine)]
        monkeypatch.setenv("HARNESSRL_ENV_NICE", "10")  # sandboxes apart from the harnesses
        monkeypatch.setenv("HARNESSRL_SANDBOX_NICE", "2")
        assert sb.exec(["bash", "-c", "nice"], timeout=30).output.split() == [str(min(19, mine + 2))]
    finally:
        sb.close()


@pytest.mark.docker
def test_docker_sandboxes_yield_the_cpu_to_the_host_and_env_nice_zero_keeps_dockers_weight(tmp_path, monkeypatch):
    """Docker weighs all containers together as one nice-0 process (its /docker cgroup), however
    nice their processes are: the sandboxes go under /harnessrl-sandboxes with the weight of nice
    10 (110 shares), so a busy command in one gets ~10% of a core the host also wants, not half
    (bench/sandbox_cpu_share.py measures it: 0.10x the host's share on the quiet machine)."""
    import uuid

    from harnessrl.sandboxes import RepoSpec, SandboxError
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig
    from harnessrl.sandboxes.limits import SANDBOX_CGROUP, nice_weight

    src, sha = _one_commit_repo(tmp_path)
    spec = RepoSpec("prio", str(src), sha)
    try:
        backend = DockerBackend(DockerConfig(run_id=f"test-prio-{uuid.uuid4().hex[:8]}"))
    except SandboxError as e:
        pytest.skip(f"docker backend unavailable here: {e}")
    info = backend.client.info()
    if os.geteuid() != 0 or info.get("CgroupDriver") != "cgroupfs":
        assert backend.cgroup_parent is None
        pytest.skip(f"needs root and Docker's cgroupfs driver (driver {info.get('CgroupDriver')!r})")
    assert backend.cgroup_parent == f"/{SANDBOX_CGROUP}"
    assert nice_weight(10) == 110 and nice_weight(0) == 1024 and nice_weight(19) == 15
    try:
        sb = backend.create(spec)
        try:
            c = backend.client.containers.get(sb.container.id)
            assert c.attrs["HostConfig"]["CgroupParent"] == f"/{SANDBOX_CGROUP}"
            if info.get("CgroupVersion", "1") == "2":
                assert (Path("/sys/fs/cgroup") / SANDBOX_CGROUP / "cpu.weight").read_text().strip() == "11"
            else:
                assert (Path("/sys/fs/cgroup/cpu") / SANDBOX_CGROUP / "cpu.shares").read_text().strip() == "110"
                lines = sb.exec(["cat", "/proc/self/cgroup"], timeout=30).output.splitlines()
                cpu_line = next(x for x in lines if x.split(":")[1] in ("cpu", "cpu,cpuacct"))
                assert cpu_line.split(":")[2] == f"/{SANDBOX_CGROUP}/{sb.container.id}"
            # what that weight gives under contention depends on what else runs on the CPU:
            # measured side by side in bench/sandbox_cpu_share.py (quiet: 0.10x the host's share)
        finally:
            sb.close()
        monkeypatch.setenv("HARNESSRL_SANDBOX_NICE", "0")  # the harnesses stay at 10, the sandboxes level
        assert DockerBackend(DockerConfig(run_id=backend.run_id)).cgroup_parent is None
        monkeypatch.delenv("HARNESSRL_SANDBOX_NICE")
        monkeypatch.setenv("HARNESSRL_ENV_NICE", "0")
        level = DockerBackend(DockerConfig(run_id=backend.run_id))
        assert level.cgroup_parent is None
        sb = level.create(spec)
        try:
            assert backend.client.containers.get(sb.container.id).attrs["HostConfig"]["CgroupParent"] == ""
            # Docker's own cgroup, at Docker's weight. Not measured by contention: in the suite
            # every other test's sandbox shares /docker with this one (the suite runs them at
            # nice 0), so the box's share of a core depends on what else runs, not on us.
            if info.get("CgroupVersion", "1") == "2":
                lines = sb.exec(["cat", "/proc/self/cgroup"], timeout=30).output.splitlines()
                path = lines[0].split(":", 2)[2]
                assert SANDBOX_CGROUP not in path, path
            else:
                lines = sb.exec(["cat", "/proc/self/cgroup"], timeout=30).output.splitlines()
                cpu_line = next(x for x in lines if x.split(":")[1] in ("cpu", "cpu,cpuacct"))
                assert cpu_line.split(":")[2] == f"/docker/{sb.container.id}", cpu_line
                assert (Path("/sys/fs/cgroup/cpu") / "docker" / "cpu.shares").read_text().strip() == "1024"
        finally:
            sb.close()
    finally:
        backend.reap(run_id=backend.run_id)


ENGINE_LIKE = """
import os, sys, threading
stop = threading.Event()
for _ in range(2):
    threading.Thread(target=stop.wait).start()
print("ready", flush=True)
sys.stdin.readline()  # the test has reserved the cores: report every thread's set, then a late thread's
late = threading.Thread(target=stop.wait); late.start()
masks = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
print(repr(masks), flush=True)
stop.set()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core for the engine needs two cores")
def test_core_reservation_keeps_the_engines_core_for_it_and_gives_every_mask_back():
    """The engine's process (every thread, and threads it starts later) runs on the reserved core
    only; this process, a process it starts afterwards (a harness) and the machine's other
    processes run on the rest; release() restores every mask."""
    from harnessrl.sandboxes.limits import CoreReservation

    before = os.sched_getaffinity(0)
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                             stdin=subprocess.PIPE, text=True)  # a process of the machine started before
    engine = subprocess.Popen([sys.executable, "-c", ENGINE_LIKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert engine.stdout.readline().strip() == "ready"
        res = CoreReservation.for_process(engine.pid)
        try:
            last = max(before)
            assert res.engine == {last} and res.env == before - {last}
            engine.stdin.write("go\n"); engine.stdin.flush()
            masks = eval(engine.stdout.readline())  # noqa: S307 - our own child's repr of a dict
            assert len(masks) >= 4 and all(m == [last] for m in masks.values()), masks
            assert os.sched_getaffinity(0) == before - {last}
            assert os.sched_getaffinity(other.pid) == before - {last}
            harness = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                     capture_output=True, text=True, check=True)
            assert eval(harness.stdout) == sorted(before - {last})  # noqa: S307
            assert "alone on core(s) [%d]" % last in res.describe()
        finally:
            res.release()
        assert os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(other.pid) == before
    finally:
        for p in (other, engine):
            p.kill()
            p.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core for the engine needs two cores")
def test_a_reservation_whose_owner_was_killed_is_undone_by_the_next(tmp_path, monkeypatch):
    """A bench killed -9 while it held the engine's core leaves every task of the machine bound to
    the environment's cores, this test process included. The next `CoreReservation` frees them
    from the ledger first (a live owner's reservation it leaves alone), reserves as usual, and its
    release gives the whole set back and drops the ledger."""
    from harnessrl.sandboxes.limits import CoreReservation

    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    ledger = tmp_path / "core-reservation.json"
    before = os.sched_getaffinity(0)
    last = max(before)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE_LIKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    owner = subprocess.Popen(
        [sys.executable, "-c", "import time; from harnessrl.sandboxes.limits import CoreReservation; "
         f"r = CoreReservation.for_process({engine.pid}); print('held', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "ready"
        assert owner.stdout.readline().strip() == "held"
        assert os.sched_getaffinity(0) == before - {last} and ledger.exists()
        if len(before) == 2:  # the owner alive: its reservation stands, one core is left to reserve from
            with pytest.raises(ValueError, match="cannot reserve 1 core"):
                CoreReservation.for_process(engine.pid)
            assert os.sched_getaffinity(0) == before - {last} and ledger.exists()
        owner.kill()
        owner.wait()
        assert os.sched_getaffinity(0) == before - {last}  # what a killed run leaves behind
        res = CoreReservation.for_process(engine.pid)
        try:
            assert res.recovered >= 2 and "freed from a killed run's reservation" in res.describe()
            assert res.engine == {last} and os.sched_getaffinity(0) == before - {last}
            assert all(os.sched_getaffinity(t) == {last} for t in map(int, os.listdir(f"/proc/{engine.pid}/task")))
        finally:
            res.release()
        assert os.sched_getaffinity(0) == before and not ledger.exists()
    finally:
        for p in (owner, engine):
            p.kill()
            p.wait()


def test_core_reservation_refuses_when_no_core_would_be_left_for_the_environment():
    from harnessrl.sandboxes.limits import CoreReservation

    n = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=f"cannot reserve {n} core"):
        CoreReservation([os.getpid()], cores=n)


def test_recovery_leaves_a_live_owners_ledger_and_drops_an_unreadable_one(tmp_path):
    """`recover_left_behind` touches nothing while the ledger's owner runs (this process, with its
    start time), and an unreadable ledger is removed rather than trusted."""
    import json

    from harnessrl.sandboxes.limits import _start_time, recover_left_behind

    ledger = tmp_path / "core-reservation.json"
    assert recover_left_behind(ledger) == 0  # none
    before = os.sched_getaffinity(0)
    ledger.write_text(json.dumps({"owner": os.getpid(), "owner_start": _start_time(os.getpid()),
                                  "env": sorted(before), "engine": sorted(before)}))
    assert recover_left_behind(ledger) == 0 and ledger.exists()
    assert os.sched_getaffinity(0) == before
    ledger.write_text("{not json")
    assert recover_left_behind(ledger) == 0 and not ledger.exists()
