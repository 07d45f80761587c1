"""Sandbox contract tests on the real Docker engine and real bubblewrap.

The source is a small git repository built in a temp dir with fixed dates (so its commit
shas, and hence the task images, are the same every run), with one commit *after* base that
must never reach a sandbox. Every contract test runs on both backends; a backend that cannot
run here is skipped with the reason.
"""
from __future__ import annotations

import os
import socket
import subprocess
import tarfile
import threading
import uuid
from pathlib import Path

import pytest

from harnessrl.sandboxes import RepoSpec, SandboxDied, SandboxError, SandboxPool, make_backend
from harnessrl.sandboxes.base import Sandbox, SandboxBackend
from harnessrl.sandboxes.pool import PoolConfig
from harnessrl.sandboxes.repo import materialize

REPO_ROOT = Path(__file__).resolve().parents[1]
CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
SETUP = ("mkdir -p build && echo artifact > build/out.txt",
         "mkdir -p ~/.local && echo installed > ~/.local/marker")


def _git(cwd, *args, env=None):
    full = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", **(env or {})}
    return subprocess.run(["git", *args], cwd=cwd, env=full, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="session")
def source(tmp_path_factory):
    """(repo dir, base sha, later sha): base has the bug; `later` (on trunk) must stay out."""
    d = tmp_path_factory.mktemp("src") / "calc"
    d.mkdir()
    _git(d, "init", "-q", "-b", "trunk")
    (d / "calc.py").write_text(CALC)
    (d / "test_calc.py").write_text(TEST)
    (d / ".gitignore").write_text("__pycache__/\n")
    _git(d, "add", "-A")
    _git(d, "commit", "-qm", "base")
    base = _git(d, "rev-parse", "HEAD")
    (d / "SECRET_FIX.txt").write_text("the answer\n")
    _git(d, "add", "-A")
    _git(d, "commit", "-qm", "later")
    _git(d, "tag", "v-later")
    return d, base, _git(d, "rev-parse", "HEAD")


def _backend(name: str, root: Path | None = None):
    if name == "docker":
        from harnessrl.sandboxes.docker import DockerConfig
        return make_backend("docker", DockerConfig(memory="256m", pids_limit=64, cpus=1.0,
                                                   run_id=f"test-{uuid.uuid4().hex[:8]}"))
    from harnessrl.sandboxes.local import LocalConfig
    return make_backend("local", LocalConfig(memory="256m", pids_limit=64, root=str(root)))


@pytest.fixture(scope="module", params=[pytest.param("docker", marks=pytest.mark.docker),
                                        pytest.param("local", marks=pytest.mark.bwrap)])
def backend(request, tmp_path_factory):
    try:
        b = _backend(request.param, tmp_path_factory.mktemp("local-root"))
    except Exception as e:  # SandboxUnavailable, or the base image missing
        pytest.skip(f"{request.param} backend unavailable here: {e}")
    yield b
    if request.param == "docker":
        b.reap(run_id=b.run_id)


@pytest.fixture(scope="module")
def spec(source):
    d, base, _ = source
    return RepoSpec("calc-test", str(d), base, setup_commands=SETUP)


@pytest.fixture
def sb(backend, spec):
    try:
        s = backend.create(spec)
    except SandboxError as e:
        if "base image" in str(e):
            pytest.skip(str(e))
        raise
    yield s
    s.close()


def _all_commits(sb: Sandbox) -> set[str]:
    res = sb.exec("git rev-list --all --reflog 2>/dev/null || git rev-list --all")
    assert res.exit_code == 0, res.output
    return set(res.output.split())


# --- materialising sources ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["path", "bundle", "archive", "ref"])
def test_materialize_holds_base_history_only(source, tmp_path, kind):
    d, base, later = source
    src, commit = str(d), base
    if kind == "bundle":
        src = str(tmp_path / "calc.bundle")
        _git(d, "bundle", "create", src, "--all")
    elif kind == "archive":
        src = str(tmp_path / "calc.tar.gz")
        with tarfile.open(src, "w:gz") as tf:
            tf.add(d, arcname="calc")
    elif kind == "ref":
        commit = "trunk~1"
    sha = materialize(RepoSpec("calc", src, commit), tmp_path / "out")
    out = tmp_path / "out"
    assert sha == base
    assert _git(out, "rev-list", "--all").split() == [base]
    assert _git(out, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert _git(out, "status", "--porcelain") == ""
    assert not (out / "SECRET_FIX.txt").exists()
    assert _git(out, "tag") == "" and _git(out, "remote") == ""


def test_bad_sources_name_the_problem(source, tmp_path):
    d, base, _ = source
    with pytest.raises(SandboxError, match="does not exist"):
        materialize(RepoSpec("x", str(tmp_path / "nope"), base), tmp_path / "o1")
    with pytest.raises(SandboxError, match="base_commit 'f00d' not found"):
        materialize(RepoSpec("x", str(d), "f00d"), tmp_path / "o2")
    with pytest.raises(ValueError, match="RepoSpec.setup_commands"):
        RepoSpec("x", str(d), base, setup_commands="pip install -e .")
    with pytest.raises(ValueError, match="RepoSpec.workdir"):
        RepoSpec("x", str(d), base, workdir="relative/dir")


def test_make_backend_registry():
    with pytest.raises(ValueError, match="valid: auto, docker, local"):
        make_backend("podman")


@pytest.mark.docker
def test_base_image_tag_matches_the_script():
    from harnessrl.sandboxes.docker import base_image_tag
    tag = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_base_image.sh"), "--print-tag"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert tag == base_image_tag() and tag.startswith("harnessrl/base:")


# --- the contract, on both backends ------------------------------------------------------------

def test_repo_at_base_without_later_commits(sb, source):
    _, base, later = source
    assert sb.exec("git rev-parse HEAD").output.strip() == base
    assert _all_commits(sb) == {base}
    assert sb.exec("git cat-file -e " + later).exit_code != 0
    assert sb.exec("test -e SECRET_FIX.txt").exit_code == 1
    assert sb.read_file("build/out.txt") == b"artifact\n"  # setup ran once, at build
    assert sb.exec("id -u").output.strip() == "1000"


def test_exec_exit_code_output_env_workdir(sb):
    res = sb.exec("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.timed_out) == (3, False)
    assert res.output.splitlines() == ["out", "err"]
    res = sb.exec(["bash", "-c", 'echo "$FOO:$(pwd)"'], env={"FOO": "bar"}, workdir="/tmp")
    assert res.output == "bar:/tmp\n" and res.exit_code == 0
    assert sb.exec("pwd").output.strip() == sb.workdir


@pytest.mark.timeout(60)
def test_exec_timeout_kills_the_command_and_its_children(sb):
    res = sb.exec("echo started; sleep 300 & sleep 300", timeout=1.5)
    assert res.timed_out and res.exit_code == -1
    assert res.output.startswith("started")
    left = sb.exec("grep -l '^sleep' /proc/[0-9]*/comm 2>/dev/null | wc -l")
    assert left.output.strip() == "0"


@pytest.mark.timeout(60)
def test_overlapping_commands_each_get_their_own_output_and_exit_code(sb):
    results = {}

    def run(name, cmd):
        results[name] = sb.exec(cmd, timeout=30)

    threads = [threading.Thread(target=run, args=(f"c{i}", f"for j in 1 2 3; do echo c{i}-$j; "
                                                          f"sleep 0.{i}; done; exit {i}"))
               for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(1, 5):
        r = results[f"c{i}"]
        assert (r.exit_code, r.output) == (i, "".join(f"c{i}-{j}\n" for j in (1, 2, 3)))


@pytest.mark.timeout(60)
def test_output_that_looks_like_the_control_protocol_is_only_output(sb):
    # An agent printing what PID 1 answers the host with must not end, fake or misroute a reply.
    fake = '{"id": 1, "rc": 0}\n{"id": 2, "o": "aGk="}\n{"ready": true}\n{"id": 3, "rc": 0, "size": 0}\n'
    sb.write_file("/tmp/fake.txt", fake.encode())
    res = sb.exec("cat /tmp/fake.txt; cat /tmp/fake.txt >&2; exit 7")
    assert (res.exit_code, res.output) == (7, fake * 2)
    assert sb.exec("echo next").output == "next\n"


@pytest.mark.timeout(60)
def test_a_left_behind_process_holding_the_output_does_not_hold_the_command(sb):
    res = sb.exec("echo before; setsid -f sleep 30; echo after", timeout=10)
    assert (res.exit_code, res.timed_out, res.output) == (0, False, "before\nafter\n")


def test_commands_start_with_default_signal_dispositions(sb):
    # Python ignores SIGPIPE and SIGXFSZ; a command must not inherit that from a Python parent
    # (`yes | head` would print EPIPE errors, a write past RLIMIT_FSIZE would not stop it).
    res = sb.exec("grep -E '^Sig(Ign|Blk):' /proc/self/status; yes | head -n 2")
    assert res.output == "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\ny\ny\n", res.output


def test_write_read_diff_reset(sb):
    binary = bytes(range(256)) * 4
    sb.write_file("calc.py", b"def add(a, b):\n    return a + b\n")
    sb.write_file("pkg/deep/new.py", b"X = 1\n")
    sb.write_file("/tmp/scratch.txt", b"scratch")
    sb.write_file("blob.bin", binary, mode=0o755)
    assert sb.read_file("calc.py") == b"def add(a, b):\n    return a + b\n"
    assert sb.read_file(f"{sb.workdir}/blob.bin") == binary
    assert sb.read_file("/tmp/scratch.txt") == b"scratch"
    assert sb.exec("stat -c %a blob.bin").output.strip() == "755"
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")
    diff = sb.diff()
    assert "+    return a + b" in diff and "b/pkg/deep/new.py" in diff and "GIT binary patch" in diff
    assert "build/out.txt" not in diff  # set-up output is part of the base state
    assert sb.exec("git status --porcelain -- pkg").output.startswith("??")  # index untouched
    assert sb.exec("python3 -c 'from calc import add; assert add(1, 2) == 3'").exit_code == 0

    sb.reset()
    assert sb.diff() == ""
    assert sb.read_file("calc.py") == CALC.encode()
    assert sb.exec("git status --porcelain --ignored").output == "!! build/\n"  # kept: set-up made it
    assert sb.exec("test -e pkg || test -e blob.bin || test -e /tmp/scratch.txt").exit_code == 1
    assert sb.read_file("build/out.txt") == b"artifact\n"


def test_reset_undoes_an_agents_change_to_what_set_up_left(sb):
    # Set-up's files are outside the diff (part of the base state), so a change to them that
    # survived reset would reach the grader unseen: reset puts them back, on every backend.
    assert sb.exec("echo forged > build/out.txt && echo extra > build/planted.py").exit_code == 0
    assert "build/" not in sb.diff()
    sb.reset()
    assert sb.read_file("build/out.txt") == b"artifact\n"
    assert sb.exec("test -e build/planted.py").exit_code == 1
    sb.reset()  # nothing changed since: still the base state
    assert sb.read_file("build/out.txt") == b"artifact\n"


def test_diff_is_against_base_even_after_agent_commits_and_reset_drops_them(sb, source):
    _, base, _ = source
    sb.write_file("calc.py", b"def add(a, b):\n    return a + b\n")
    res = sb.exec("git add -A && git commit -qm cheat && git tag t1 && git branch side && git stash list")
    assert res.exit_code == 0, res.output
    assert "+    return a + b" in sb.diff()
    sb.reset()
    assert _all_commits(sb) == {base}
    assert sb.exec("git tag; git branch --format='%(refname:short)'").output.split() == ["main"]


def test_reset_undoes_tampering_with_git_metadata(sb):
    # An agent hiding its files from the diff (info/exclude) must not outlive its episode.
    sb.write_file(".git/info/exclude", b"*.txt\n")
    sb.exec("git config core.hooksPath /tmp/hooks")
    sb.reset()
    sb.write_file("notes.txt", b"visible\n")
    assert "b/notes.txt" in sb.diff()
    assert sb.exec("git config core.hooksPath").exit_code == 1


@pytest.mark.timeout(120)
def test_large_patch_travels_as_a_file(sb, tmp_path):
    lines = [f"line {i:06d} {'x' * 40}\n" for i in range(10_000)]
    content = "".join(lines)
    patch = ("diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n"
             f"@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + ln for ln in lines)).encode()
    assert len(patch) > 500_000
    sb.write_file("/tmp/big.patch", patch)
    res = sb.exec("git apply /tmp/big.patch && wc -l < big.txt")
    assert res.exit_code == 0 and res.output.strip() == "10000", res.output
    assert sb.read_file("big.txt") == content.encode()
    diff = sb.diff()
    assert len(diff) > 500_000 and diff.count("\n+line ") == 10_000


@pytest.mark.timeout(60)
def test_no_network_from_inside(sb):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    probe = ("import socket, sys\n"
             "for host, port in (('127.0.0.1', int(sys.argv[1])), ('1.1.1.1', 80)):\n"
             "    s = socket.socket(); s.settimeout(3)\n"
             "    try: s.connect((host, port)); print(host, 'CONNECTED')\n"
             "    except OSError as e: print(host, 'failed', type(e).__name__)\n")
    sb.write_file("/tmp/probe.py", probe.encode())
    res = sb.exec(["python3", "/tmp/probe.py", str(port)], timeout=30)
    stop.set()
    t.join()
    listener.close()
    assert "CONNECTED" not in res.output, res.output
    assert res.output.count("failed") == 2, res.output
    assert accepted == []  # the host listener never saw the sandbox
    assert sb.exec("cat /proc/net/dev | grep -v -e lo: -e Inter -e face | wc -l").output.strip() == "0"


def _limits_or_skip(backend, sb):
    if getattr(sb, "limits_enforced", True) is False:
        pytest.skip(f"{backend.name}: no writable cgroup here, memory/pids limits not enforced")


@pytest.mark.timeout(120)
def test_fork_bomb_is_contained(backend, sb):
    _limits_or_skip(backend, sb)
    res = sb.exec(":(){ :|:& };:; sleep 3", timeout=10)  # the shell lives on while it forks
    assert "Resource temporarily unavailable" in res.output, res  # it hit the pids limit
    assert subprocess.run(["true"]).returncode == 0  # the host still forks
    after = sb.exec("echo alive; ls -d /proc/[0-9]* | wc -l")
    assert after.exit_code == 0 and after.output.startswith("alive\n")
    assert int(after.output.split()[1]) < 10  # the bomb is gone, not just throttled


@pytest.mark.timeout(120)
def test_memory_hog_is_contained(backend, sb):
    _limits_or_skip(backend, sb)
    hog = "b = []\nfor i in range(128):\n    b.append(bytearray(16 << 20))\nprint('survived')\n"
    sb.write_file("/tmp/hog.py", hog.encode())
    res = sb.exec("python3 /tmp/hog.py", timeout=60)
    assert res.exit_code == 137 and "survived" not in res.output, res  # OOM-killed at 256m
    assert sb.exec("echo alive").output == "alive\n"


def test_pool_reset_gives_a_clean_repo(backend, spec, source):
    _, base, _ = source
    with SandboxPool(backend, PoolConfig(size=1, refill=False)) as pool:
        pool.prewarm(spec)
        assert pool.idle(spec) == 1
        first = pool.acquire(spec)
        first.write_file("calc.py", b"broken = True\n")
        first.write_file("/tmp/hidden_tests.py", b"assert False\n")
        first.write_file("/home/agent/.bashrc", b"echo hi\n")
        first.exec("touch untracked.txt && git add -A && git commit -qm x")
        if backend.name == "docker":  # a server left running by the last episode
            first.exec("setsid -f sh -c 'touch /tmp/up; exec sleep 1000' > /dev/null 2>&1 < /dev/null; "
                       "until [ -e /tmp/up ]; do sleep 0.01; done")
            assert first.exec("grep -l '^sleep' /proc/[0-9]*/comm | wc -l").output.strip() == "1"
        pool.release(first)
        again = pool.acquire(spec)
        assert again is first  # the warm one was reused, not rebuilt
        assert again.diff() == "" and again.read_file("calc.py") == CALC.encode()
        assert again.exec("git status --porcelain; ls -A /tmp").output == ""
        assert "echo hi" not in again.exec("cat ~/.bashrc 2>/dev/null; true").output
        assert again.read_file("/home/agent/.local/marker") == b"installed\n"  # set-up's stays
        assert again.exec("grep -l '^sleep' /proc/[0-9]*/comm 2>/dev/null | wc -l").output.strip() == "0"
        assert _all_commits(again) == {base}
        pool.release(again)


# --- docker only: dying containers and the reaper ----------------------------------------------

@pytest.fixture(scope="module")
def docker_backend():
    try:
        b = _backend("docker")
    except Exception as e:
        pytest.skip(f"docker backend unavailable here: {e}")
    yield b
    b.reap(run_id=b.run_id)


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_output_past_the_limit_is_cut_and_the_sandbox_serves_on(docker_backend, spec):
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig
    limit = 1 << 16
    small = DockerBackend(DockerConfig(output_limit=limit, run_id=docker_backend.run_id))
    sb = small.create(spec)
    try:  # 50 MB through a 64 KiB limit: PID 1 reads it all, sends the first 64 KiB
        res = sb.exec("head -c 50000000 /dev/zero | tr '\\0' x; echo; echo done >&2")
        assert res.exit_code == 0
        assert res.output == "x" * limit + f"\n[harnessrl: output truncated at {limit} bytes]\n"
        assert sb.exec("echo served").output == "served\n"
        # Nothing a container prints is kept by the daemon (PID 1's stdout carries it all).
        assert docker_backend.client.api.inspect_container(sb.id)["HostConfig"]["LogConfig"]["Type"] == "none"
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_killed_container_raises_sandbox_died(docker_backend, spec):
    sb = docker_backend.create(spec)
    assert sb.alive()
    docker_backend.client.api.kill(sb.id)  # from outside, as a crashed daemon or OOM of PID 1 would
    assert not sb.alive()
    with pytest.raises(SandboxDied):
        sb.exec("echo hi")
    with pytest.raises(SandboxDied):
        sb.read_file("calc.py")
    sb.close()
    assert docker_backend.client.containers.list(all=True, filters={"id": sb.id}) == []


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_reaper_removes_leftovers_of_a_crashed_run(spec):
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig, reap
    try:
        crashed = DockerBackend(DockerConfig(run_id=f"crashed-{uuid.uuid4().hex[:8]}"))
    except Exception as e:
        pytest.skip(f"docker unavailable: {e}")
    left = [crashed.create(spec), crashed.create(spec, start=False)]
    client = crashed.client
    volumes = {m["Name"] for s in left for m in client.api.inspect_container(s.id)["Mounts"]
               if m["Type"] == "volume"}
    assert len(volumes) == 6
    assert reap(client, older_than_s=3600, run_id=crashed.run_id) == 0  # too young
    assert reap(client, run_id=crashed.run_id) == 2
    label = f"harnessrl.run_id={crashed.run_id}"
    assert client.containers.list(all=True, filters={"label": label}) == []
    assert volumes.isdisjoint(v.name for v in client.volumes.list())
    with pytest.raises(SandboxDied):
        left[0].exec("true")


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_agent_cannot_stop_or_drive_the_sandbox_init(docker_backend, spec):
    # Killing its own sandbox would turn a failing episode into an (unscored) infra error.
    sb = docker_backend.create(spec)
    try:
        res = sb.exec("kill -KILL 1; kill -TERM 1; kill -INT 1; echo reset > /proc/1/fd/0; "
                      "cat /proc/1/environ > /dev/null")
        assert res.exit_code != 0 and "Permission denied" in res.output, res.output
        assert sb.alive() and sb.exec("echo alive").output == "alive\n"
        sb.write_file("calc.py", b"x = 1\n")
        sb.reset()  # the host's channel to PID 1 still works
        assert sb.read_file("calc.py") == CALC.encode()
    finally:
        sb.close()


@pytest.mark.bwrap
@pytest.mark.timeout(60)
def test_local_reaper_removes_leftover_boxes(spec, tmp_path):
    try:
        crashed = _backend("local", tmp_path / "root")
    except Exception as e:
        pytest.skip(f"bubblewrap unavailable: {e}")
    sb = crashed.create(spec)
    assert sb.exec("echo up").output == "up\n"
    assert crashed.reap(older_than_s=3600) == 0
    assert crashed.reap() == 1
    assert list((tmp_path / "root" / "boxes").iterdir()) == []
    with pytest.raises(SandboxDied):
        sb.exec("true")
    if sb.cgroup is not None:
        assert not any(d.exists() for d in sb.cgroup.dirs)


def test_mounts_and_env_reach_every_command(backend, spec, tmp_path):
    assert isinstance(backend, SandboxBackend)
    tools, shared = tmp_path / "tools", tmp_path / "shared"
    tools.mkdir()
    shared.mkdir()
    shared.chmod(0o777)  # the sandbox user is uid 1000
    (tools / "hello.sh").write_text("#!/bin/sh\necho hello from tools\n")
    (tools / "hello.sh").chmod(0o755)
    sb = backend.create(spec, mounts=[(str(tools), "/opt/tools", True), (str(shared), "/run/shared", False)],
                        env={"HARNESSRL_X": "42"})
    try:
        assert isinstance(sb, Sandbox)
        assert sb.exec("/opt/tools/hello.sh; echo $HARNESSRL_X").output == "hello from tools\n42\n"
        assert sb.exec("touch /opt/tools/nope").exit_code != 0  # read-only
        assert sb.exec("echo out > /run/shared/f.txt").exit_code == 0
        assert (shared / "f.txt").read_text() == "out\n"
    finally:
        sb.close()


@pytest.mark.timeout(300)
def test_failing_setup_command_names_itself(backend, source):
    d, base, _ = source
    bad = RepoSpec(f"calc-badsetup-{uuid.uuid4().hex[:6]}", str(d), base,
                   setup_commands=("echo ok", "exit 7  # broken-step"))
    with pytest.raises(SandboxError, match="broken-step"):
        backend.create(bad)


@pytest.mark.docker
def test_a_container_that_fails_to_start_is_removed(backend, spec, monkeypatch):
    """A start that fails (here the daemon refuses it; also an init never ready, an attach
    refused) raises, and the container it was for is removed: before, it stayed behind as
    "Created", outliving the run (seen after a stop in `harnessrl train`'s start-up)."""
    import docker.errors
    import docker.models.containers

    from harnessrl.sandboxes.docker import RUN_LABEL

    if backend.name != "docker":
        pytest.skip("the Docker backend's create")

    def ours() -> list[str]:
        return [c["Id"] for c in backend.client.api.containers(
            all=True, filters={"label": f"{RUN_LABEL}={backend.run_id}"})]

    before = ours()

    def refuse(self, *args, **kwargs) -> None:
        raise docker.errors.APIError("the daemon refused the start")

    monkeypatch.setattr(docker.models.containers.Container, "start", refuse)
    with pytest.raises(SandboxError, match="failed to start: APIError"):
        backend.create(spec)
    assert ours() == before
    monkeypatch.undo()
    sb = backend.create(spec)  # the backend still serves
    try:
        assert ours() != before and sb.exec("cat calc.py").output == CALC
    finally:
        sb.close()
    assert ours() == before
