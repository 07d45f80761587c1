"""The bubblewrap backend as an attacker inside it sees it: no host root, no host secrets.

Real bubblewrap, real cgroups and loop mounts where this machine allows them (tests that need
root say so when skipped). Every check is made from inside the sandbox, or on the host
against what the sandbox left there (owners of files it made, uids of its processes).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from harnessrl.sandboxes import RepoSpec, SandboxError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repo_helpers import one_commit_repo  # noqa: E402

pytestmark = pytest.mark.bwrap
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to plant root-only files, to have a "
                               "uid to drop to, to loop-mount a quota")
SECRET = "hunter2-do-not-leak-7f3a"


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    d = tmp_path_factory.mktemp("src") / "sec"
    return RepoSpec("sec-test", str(d), one_commit_repo(d, {"mod.py": "X = 1\n"}),
                    setup_commands=("mkdir -p ~/.cache && echo set-up > ~/.cache/marker",))


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from harnessrl.sandboxes.local import LocalBackend, LocalConfig
    try:
        b = LocalBackend(LocalConfig(root=str(tmp_path_factory.mktemp("local-root")), memory="256m",
                                     pids_limit=64, disk_quota="64m", sandbox_uid=64123, sandbox_gid=64123))
    except SandboxError as e:
        pytest.skip(f"local backend unavailable here: {e}")
    yield b
    assert b.reap() == 0  # every test closed its sandboxes (reap would unmount what one left)


@pytest.fixture
def sb(backend, spec):
    s = backend.create(spec, env={"SANDBOX_VAR": "from-sandbox"})
    yield s
    s.close()


def _expected_uid(backend) -> int:
    return backend.config.sandbox_uid if os.geteuid() == 0 else os.getuid()


def test_files_the_agent_makes_belong_to_an_unprivileged_host_uid(backend, sb):
    assert sb.exec("id -u; id -g").output.split() == ["1000", "1000"]
    assert sb.exec("touch made_inside /tmp/t /home/agent/h").exit_code == 0
    for p in (sb.box / "repo" / "made_inside", sb.box / "tmp" / "t", sb.box / "home" / "h"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) != (0, 0)
        assert st.st_uid == _expected_uid(backend)
    assert sb.read_file("/home/agent/.cache/marker") == b"set-up\n"  # set-up's home is the agent's


@pytest.mark.timeout(60)
def test_the_agents_processes_run_as_that_uid_inside_the_cgroup(backend, sb):
    done = threading.Event()
    box_tmp = sb.box / "tmp"

    def run():
        sb.exec("touch /tmp/up; until [ -e /tmp/stop ]; do sleep 0.05; done", timeout=50)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    try:
        while not (box_tmp / "up").exists():
            assert not done.is_set(), "the command ended before it was seen"
            done.wait(0.05)
        pids = sb.cgroup.pids() if sb.cgroup else set()
        host_uids = set()
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                continue
            uid_line = next(ln for ln in status.splitlines() if ln.startswith("Uid:"))
            host_uids |= set(uid_line.split()[1:])  # real, effective, saved, filesystem
    finally:
        (box_tmp / "stop").touch()
        t.join()
    if sb.cgroup is None:
        pytest.skip("no writable cgroup here: cannot list the sandbox's host processes")
    assert pids, "the command's processes joined the sandbox's cgroup"
    assert "0" not in host_uids  # not even the setup chain is left as root inside the cgroup
    assert host_uids == {str(_expected_uid(backend))}


def test_root_only_host_files_are_unreadable(sb):
    res = sb.exec("cat /etc/shadow")
    assert res.exit_code != 0 and "Permission denied" in res.output, res.output
    if os.path.exists("/etc/docker/key.json"):
        res = sb.exec("cat /etc/docker/key.json")
        assert res.exit_code != 0 and "Permission denied" in res.output, res.output


@ROOT_ONLY
def test_a_root_only_file_under_a_bound_path_is_unreadable(backend, spec, tmp_path):
    secret_dir = tmp_path / "bound"
    secret_dir.mkdir()
    secret_dir.chmod(0o755)
    planted = secret_dir / "root-only"
    planted.write_text(SECRET)
    planted.chmod(0o600)
    os.chown(planted, 0, 0)
    sb = backend.create(spec, mounts=[(str(secret_dir), "/opt/bound", True)])
    try:
        in_repo = sb.box / "repo" / "root-only"  # one planted in the agent's own repo, too
        in_repo.write_text(SECRET)
        in_repo.chmod(0o600)
        os.chown(in_repo, 0, 0)
        res = sb.exec("cat /opt/bound/root-only; cat root-only; ls /opt/bound")
        assert SECRET not in res.output
        assert res.output.count("Permission denied") == 2, res.output
        assert "root-only" in res.output  # the mount itself is there: only the file is closed
    finally:
        sb.close()


def test_a_fresh_proc_and_an_allowlisted_environment(monkeypatch, backend, sb):
    monkeypatch.setenv("HARNESSRL_TEST_SECRET", SECRET)  # in this process's env while it launches
    res = sb.exec(["python3", "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                  env={"EXEC_VAR": "from-exec"})
    assert json.loads(res.output) == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                      "HOME": "/home/agent", "USER": "agent", "LANG": "C.UTF-8",
                                      "PYTHONDONTWRITEBYTECODE": "1", "SANDBOX_VAR": "from-sandbox",
                                      "EXEC_VAR": "from-exec", "PWD": "/workspace/repo",
                                      "SHLVL": "0"}  # bwrap's --chdir, the launch marker's exec
    every = sb.exec("for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done; "
                    "ls -d /proc/[0-9]* | wc -l")
    assert every.exit_code == 0, every.output
    assert SECRET not in every.output and "HARNESSRL_TEST_SECRET" not in every.output
    assert str(sb.box) not in every.output  # bwrap read its binds from a memfd, not argv
    assert int(every.output.split()[-1]) < 8  # its own PID namespace: a handful of processes
    init_env = sb.exec("tr '\\0' '\\n' < /proc/1/environ").output.split()
    assert {kv.split("=", 1)[0] for kv in init_env} <= {"PATH", "HOME", "USER", "LANG",
                                                        "PYTHONDONTWRITEBYTECODE", "PWD"}
    assert "bwrap" in sb.exec("cat /proc/1/cmdline").output  # PID 1 is the sandbox's own init


def test_dev_shm_mqueue_and_ipc_do_not_outlive_a_command_or_a_reset(sb):
    planted = sb.exec("echo leak > /dev/shm/hidden && mkdir -p /dev/mqueue && echo leak > /dev/mqueue/q "
                      "&& ipcmk -Q >/dev/null && ipcs -q | grep -c '^0x'")
    assert planted.exit_code == 0 and planted.output.strip() == "1", planted.output
    after = "ls -A /dev/shm; ls -A /dev/mqueue 2>/dev/null; ipcs -q | grep -c '^0x'"
    assert sb.exec(after).output.split() == ["0"]
    sb.exec("echo leak > /dev/shm/hidden")
    sb.reset()
    assert sb.exec(after).output.split() == ["0"]


@pytest.mark.timeout(120)
def test_disk_quota_and_file_size_limit(backend, sb):
    q = 64 << 20
    got = sb.exec(["python3", "-c", "import resource; print(*resource.getrlimit(resource.RLIMIT_FSIZE))"])
    assert got.output.split() == [str(q), str(q)]  # no single file over the quota, anywhere
    if not sb.quota_enforced:
        pytest.skip("no loop mount here (needs root): only RLIMIT_FSIZE bounds the disk")
    fill = sb.exec("for d in /tmp /home/agent .; do dd if=/dev/zero of=$d/fill bs=1M count=30 status=none; done; "
                   "cat /tmp/fill /home/agent/fill fill | wc -c")
    assert "No space left on device" in fill.output, fill.output  # repo, /tmp, home share one quota
    assert 40 << 20 < int(fill.output.split()[-1]) < q
    assert sb.exec("rm -f /tmp/fill /home/agent/fill fill && echo ok").output == "ok\n"
    sb.reset()
    assert sb.exec("dd if=/dev/zero of=/tmp/x bs=1M count=20 2>/dev/null && echo fits").output == "fits\n"


def test_launch_failures_raise_instead_of_looking_like_the_agents_exit(backend, spec, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    sb = backend.create(spec, mounts=[(str(gone), "/opt/gone", True)])
    try:
        assert sb.exec("exit 3").exit_code == 3
        gone.rmdir()
        with pytest.raises(SandboxError, match="could not start a command"):
            sb.exec("echo never")
    finally:
        sb.close()


def test_host_side_cleans_up_whatever_the_agent_left(backend, spec):
    sb = backend.create(spec)
    res = sb.exec("mkdir -p /tmp/locked/deep ~/locked pkg/sub && touch /tmp/locked/deep/f pkg/sub/new.py "
                  "&& chmod 000 /tmp/locked ~/locked mod.py pkg/sub/new.py pkg/sub pkg && chmod a-w . "
                  "&& ln -s /etc/passwd /tmp/link && chmod 000 /home/agent")
    assert res.exit_code == 0, res.output
    sb.reset()
    assert sb.exec("ls -A /tmp; cat ~/.cache/marker; git status --porcelain --ignored; cat mod.py").output \
        == "set-up\nX = 1\n"
    assert os.stat("/etc/passwd").st_mode & 0o777 == 0o644  # the planted link was never followed
    box, image = sb.box, backend.root / "disks" / f"{sb.box.name}.img"
    sb.exec("chmod 000 /tmp /home/agent")
    sb.close()
    assert not box.exists() and not image.exists()
    assert os.path.exists("/etc/passwd")


@ROOT_ONLY
def test_sources_the_sandbox_uid_cannot_reach_are_staged_and_the_stage_goes_at_close(spec, tmp_path):
    from harnessrl.sandboxes.bwrap import STAGE_ROOT
    from harnessrl.sandboxes.local import LocalBackend, LocalConfig
    reachable_root = Path(tempfile.mkdtemp(prefix="harnessrl-sec-", dir="/var/tmp"))
    try:
        reachable_root.chmod(0o755)
        backend = LocalBackend(LocalConfig(root=str(reachable_root), sandbox_uid=64123, sandbox_gid=64123))
        hidden = tmp_path / "private" / "data"  # under pytest's 0700 dirs: uid 64123 cannot look it up
        hidden.mkdir(parents=True)
        (tmp_path / "private").chmod(0o700)
        hidden.chmod(0o777)
        sb = backend.create(spec, mounts=[(str(hidden), "/run/data", False)])
        try:
            staged = [e for e in sb._binds.entries if e[3] is not None]
            assert [e[1] for e in staged] == [str(hidden)]  # the box itself binds directly
            assert sb.exec("echo hi > /run/data/f && echo ok").output == "ok\n"
            assert (hidden / "f").stat().st_uid == 64123
            stage_dir = sb._binds.dir
            assert stage_dir is not None and stage_dir.parent == STAGE_ROOT
        finally:
            sb.close()
        assert not stage_dir.exists()
        assert not any(STAGE_ROOT.glob(backend._cgroup_name("") + "*"))  # the builder's went too
    finally:
        shutil.rmtree(reachable_root, ignore_errors=True)


def test_no_root_in_a_nested_user_namespace(sb):
    res = sb.exec("unshare -Ur id -u; echo rc=$?")
    assert "rc=0" not in res.output and not res.output.startswith("0\n"), res.output
    assert sb.exec("id -u").output == "1000\n"


def test_reap_unmounts_and_removes_what_a_crashed_run_left(backend, spec, tmp_path):
    from harnessrl.sandboxes.bwrap import STAGE_ROOT
    crashed = backend.create(spec, mounts=[(str(tmp_path), "/opt/x", True)])  # never closed
    image = backend.root / "disks" / f"{crashed.box.name}.img"
    assert image.exists() == crashed.quota_enforced == os.path.ismount(crashed.box)
    assert backend.reap(older_than_s=3600) == 0
    assert backend.reap() == 1
    assert not crashed.box.exists() and not image.exists()
    assert not any(STAGE_ROOT.glob(backend._cgroup_name("") + "*"))


def test_a_command_that_dies_at_once_is_the_commands_exit_not_a_launch_failure(backend, spec):
    sb = backend.create(spec, env={"BASH_ENV": "/tmp/die.sh"})  # sourced by every bash -c
    try:
        sb.write_file("/tmp/die.sh", b"exit 7\n")
        assert sb.exec("echo never").exit_code == 7  # the agent's to own, never an infra error
        res = sb.exec(["sh", "-c", "kill -9 $$"])
        assert res.exit_code == 137, res  # bwrap reports 128 + SIGKILL
    finally:
        sb.close()


@ROOT_ONLY
def test_a_quota_that_cannot_be_mounted_is_said_so_or_refused(spec, tmp_path, caplog):
    from harnessrl.sandboxes import SandboxUnavailable
    from harnessrl.sandboxes.local import LocalBackend, LocalConfig
    tiny = dict(root=str(tmp_path / "r"), disk_quota="16k")  # too small for any ext4
    sb = LocalBackend(LocalConfig(**tiny)).create(spec)
    try:
        assert not sb.quota_enforced and "disk quota not enforced" in caplog.text
        assert sb.exec("echo ok").output == "ok\n"
    finally:
        sb.close()
    with pytest.raises(SandboxUnavailable, match="disk quota cannot be enforced"):
        LocalBackend(LocalConfig(**tiny, require_limits=True)).create(spec)
    assert list((tmp_path / "r" / "boxes").iterdir()) == []


def test_what_the_agent_can_break_fails_its_own_commands_never_the_launch(backend, spec):
    # A launch failure is the infrastructure's (masked); nothing the agent does may cause one.
    sb = backend.create(spec)
    try:
        assert sb.exec("chmod 000 /workspace/repo /tmp /home/agent").exit_code == 0
        res = sb.exec("echo hi")  # cannot even enter its workdir now: its failure, not a launch's
        assert res.exit_code == 1 and "Permission denied" in res.output, res.output
        assert sb.exec("echo hi", workdir="/tmp/gone").exit_code == 1
        assert sb.exec("echo from-root", workdir="/").output == "from-root\n"
        sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=8 status=none", workdir="/")
        sb.reset()
        assert sb.exec("cat mod.py; git status --porcelain").output == "X = 1\n"
        assert sb.exec("rm -rf .git && dd if=/dev/zero of=junk bs=1M count=80 status=none; ls -a").exit_code == 0
        sb.reset()  # no .git, a full disk: the repo comes back from the cached checkout
        assert sb.diff() == "" and sb.exec("cat mod.py; git status --porcelain").output == "X = 1\n"
    finally:
        sb.close()
