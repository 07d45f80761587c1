"""A second Docker engine acts as a remote host: sandboxes there get nothing of this host's
filesystem, and a beside and an inside harness pass `check-adapter` against it.

Real parts: a second `dockerd` started by the fixture with its own socket, data root, exec root
(so its own containerd), pidfile and cgroup parent, in its own mount namespace where the
harness toolchain's host path is an empty tmpfs (a bind mount of it would show nothing there);
the real mini-swe-agent and Codex CLI; the scripted policy with the real tokenizer; the proxy
on loopback, reached from inside the remote sandbox through the attach-stream tunnel only.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harnessrl.adapters.toolchain import toolchain_root
from harnessrl.sandboxes import RepoSpec, SandboxUnavailable




def test_the_engine_is_validated_in_docker_host_form():
    from pydantic import ValidationError

    from harnessrl.sandboxes.docker import DockerConfig
    from harnessrl.sandboxes.engine import is_local, resolve

    assert DockerConfig(engine="ssh://me@build-7").engine == "ssh://me@build-7"
    with pytest.raises(ValidationError, match=r"engine\n.*engine 'http://h:2375': want DOCKER_HOST form"):
        DockerConfig(engine="http://h:2375")
    from harnessrl.gym.rollout import RolloutConfig

    run = RolloutConfig(docker={"engine": "tcp://10.0.0.2:2376", "cert_path": "/certs"})  # a run's own engine
    assert (run.docker.engine, run.docker.cert_path, run.docker.host_mounts) == ("tcp://10.0.0.2:2376", "/certs", None)
    with pytest.raises(ValidationError, match=r"docker.enigne\n  Extra inputs are not permitted"):
        RolloutConfig(docker={"enigne": "tcp://10.0.0.2:2376"})
    assert resolve("/tmp/d.sock") == "unix:///tmp/d.sock"
    assert is_local("unix:///var/run/docker.sock") and not is_local("unix:///tmp/d.sock")
    assert not is_local("tcp://10.0.0.2:2376")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """unix:///.../docker.sock of a second dockerd in its own mount namespace (see the docstring)."""
    if os.geteuid() != 0 or not (shutil.which("dockerd") and shutil.which("unshare")):
        pytest.skip("a second dockerd needs root, dockerd and unshare")
    d = Path(tmp_path_factory.mktemp("dockerd2"))
    hide = toolchain_root()
    script = d / "start.sh"
    script.write_text(f"""set -e
mount --make-rprivate /
if [ -d {hide} ]; then mount -t tmpfs tmpfs {hide}; fi
exec dockerd --bridge=none --iptables=false --ip-masq=false -H unix://{d}/docker.sock --data-root {d}/data \\
  --exec-root {d}/exec --pidfile {d}/docker.pid --cgroup-parent /harnessrl-dockerd2-{os.getpid()}
""")
    log = open(d / "dockerd.log", "w")
    proc = subprocess.Popen(["unshare", "-m", "bash", str(script)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"unix://{d}/docker.sock"
    import docker

    for _ in range(600):  # until it answers (or it died)
        if proc.poll() is not None:
            pytest.skip(f"the second dockerd did not start: {(d / 'dockerd.log').read_text()[-1500:]}")
        try:
            docker.DockerClient(base_url=url, timeout=5).ping()
            break
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    log.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def remote(engine):
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig

    return DockerBackend(DockerConfig(engine=engine, memory="512m", run_id="remote-test"))


@pytest.mark.docker
@pytest.mark.slow
def test_the_remote_backend_binds_nothing_and_records_why_cgroups_are_skipped(remote, engine, tmp_path):
    from tests.test_sandboxes import _git

    assert (remote.local, remote.host_mounts, remote.cgroup_parent) == (False, False, None)
    assert remote.cgroup_note.startswith(f"engine {engine} is not this machine's default")
    src = tmp_path / "src"
    src.mkdir()
    (src / "tool.txt").write_text("from the host\n")
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    from harnessrl.adapters.base import Mount

    sb = remote.create(RepoSpec("remote-calc", str(repo), _git(repo, "rev-parse", "HEAD")),
                       mounts=[Mount(str(src), "/opt/tools", True), Mount(str(tmp_path), "/run/harnessrl", False,
                                                                           socket=True)])
    try:
        # the read-only folder arrived as a copy; the socket dir is not there at all
        assert sb.exec("cat /opt/tools/tool.txt; ls /run/harnessrl 2>&1 | head -1").output == \
            "from the host\nls: cannot access '/run/harnessrl': No such file or directory\n"
        mounts = remote.client.api.inspect_container(sb.id)["Mounts"]
        assert {m["Type"] for m in mounts} == {"volume"}
        tools = [m for m in mounts if m["Destination"] == "/opt/tools"]
        assert len(tools) == 1 and tools[0]["Name"].startswith("harnessrl-ro-") and tools[0]["RW"] is False
        assert sb.exec("touch /opt/tools/x").exit_code == 1  # read-only
        with pytest.raises(SandboxUnavailable, match="mount .* -> /opt/rw: engine .* takes no host bind mounts"):
            remote.create(RepoSpec("remote-calc", str(repo), _git(repo, "rev-parse", "HEAD")),
                          mounts=[Mount(str(src), "/opt/rw", False)])
    finally:
        sb.close()
    # a warm pool on the second engine: a released sandbox is reset there and handed out again
    from harnessrl.sandboxes.pool import PoolConfig, SandboxPool

    spec = RepoSpec("remote-calc", str(repo), _git(repo, "rev-parse", "HEAD"))
    pool = SandboxPool(remote, PoolConfig(size=1))
    try:
        first = pool.acquire(spec)
        first.write_file("dirt.txt", b"x")
        assert pool.release(first) is not None
        again = pool.acquire(spec)
        assert again.id == first.id and again.exec("ls").output == "a.txt\n"
        assert again.id in {c.id for c in remote.client.containers.list()}
        pool.release(again)
    finally:
        pool.close()
    # reaping is per engine: this run's containers on the second engine, none of the first's
    sb2 = remote.create(spec)
    assert remote.reap(run_id="remote-test") == 1 and not sb2.alive()


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness", ["mini-swe-agent", "codex"])
def test_check_adapter_passes_against_the_remote_engine(engine, harness, monkeypatch):
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.tools.check_adapter import check_adapter

    kind, name = ("venvs", "mini-swe-agent") if harness == "mini-swe-agent" else ("npm", "codex")
    if installed_spec(kind, name) is None:
        pytest.skip(f"{harness} is not installed in the toolchain: scripts/install_harnesses.sh {name}")
    monkeypatch.setenv("DOCKER_HOST", engine)  # check-adapter's docker backend: the second engine
    report = check_adapter(harness, "docker", wall_time_s=300)
    assert report.ok, [(c.name, c.detail) for c in report.checks if not c.ok]
    assert report.harness["gold"]["reason"] == "submitted" and report.harness["empty"]["reason"] == "submitted"
    import docker

    vols = docker.DockerClient(base_url=engine).volumes.list(filters={"label": "harnessrl.copy_of"})
    copied = {v.attrs["Labels"]["harnessrl.copy_of"].rsplit("/toolchain/", 1)[-1] for v in vols}
    if harness == "codex":  # what the inside harness runs from was copied to the engine, and only that
        assert {"node", "npm/codex"} <= copied and not any(c.startswith(("venvs", "pip")) for c in copied)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_task_with_its_own_dockerfile_is_built_and_graded_on_the_remote_engine(remote):
    from harnessrl.gym.grading.score import score
    from harnessrl.gym.tasks.harbor.loader import load_dir

    shipped = Path(__file__).resolve().parents[1] / "gym" / "tasks" / "suites" / "harbor"
    task = next(t for t in load_dir(shipped) if t.instance_id == "wordcount-fix")
    sb = remote.create(task.repo_spec())
    try:
        assert sb.container.client.api.inspect_container(sb.id)["Image"] in \
            {i.id for i in remote.client.images.list()}  # the image is the second engine's own build
        assert sb.exec("ls /app").output.split() == ["README.md", "wordcount.py"]
        assert score(sb, task).reward == 0.0  # graded there: the bug is still in
    finally:
        sb.close()
