"""Docker sandboxes: what reset empties beyond the tree (/dev/shm, /dev/mqueue, SysV IPC,
detached processes), what it restores (set-up's ignored files, once the agent touched them),
and the disk limits this engine can enforce (RLIMIT_FSIZE per file, the size of /dev/shm),
measured on the real engine."""
from __future__ import annotations

import uuid

import pytest

from harnessrl.gym.tasks.loaders import load_suite
from harnessrl.sandboxes import make_backend

CALC = next(t for t in load_suite("builtin") if t.instance_id.endswith("calc-2"))
MIB = 1 << 20


@pytest.fixture(scope="module")
def backend():
    from harnessrl.sandboxes.docker import DockerConfig
    try:
        b = make_backend("docker", DockerConfig(run_id=f"test-scratch-{uuid.uuid4().hex[:8]}",
                                                file_size_limit=8 * MIB, shm_size="4m"))
    except Exception as e:  # SandboxUnavailable: no engine here
        pytest.skip(f"docker backend unavailable here: {e}")
    yield b
    b.reap(run_id=b.run_id)


@pytest.fixture
def sb(backend):
    sandbox = backend.create(CALC.repo_spec())
    yield sandbox
    sandbox.close()


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_reset_empties_shm_mqueue_sysv_ipc_and_kills_detached_processes(sb):
    made = sb.exec("echo secret > /dev/shm/leak && mkdir -p /dev/shm/d && : > /dev/mqueue/q "
                   "&& ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null "
                   "&& setsid -f sleep 600 && ipcs -m -q | grep -c '^0x'; ls -A /dev/shm /dev/mqueue",
                   timeout=30)
    assert made.output.split() == ["2", "/dev/mqueue:", "q", "/dev/shm:", "d", "leak"], made.output
    sb.reset()
    after = sb.exec("ipcs -m -q | grep -c '^0x'; ls -A /dev/shm /dev/mqueue", timeout=30)
    assert after.output.split() == ["0", "/dev/mqueue:", "/dev/shm:"], after.output
    assert "sleep" not in sb.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout=30).output


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_file_size_limit_and_shm_size_are_enforced(sb):
    big = sb.exec("head -c 16M /dev/zero > /tmp/big; echo rc=$?; stat -c %s /tmp/big", timeout=30)
    assert big.output.split()[-2:] == ["rc=153", str(8 * MIB)], big.output  # SIGXFSZ at 8 MiB
    repo = sb.exec("head -c 16M /dev/zero > big.bin; stat -c %s big.bin", timeout=30)
    assert repo.output.split()[-1] == str(8 * MIB), repo.output  # the repository volume too
    shm = sb.exec("head -c 6M /dev/zero > /dev/shm/x; echo rc=$?; stat -c %s /dev/shm/x", timeout=30)
    assert shm.output.split()[-2:] == ["rc=1", str(4 * MIB)], shm.output  # ENOSPC at 4 MiB


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_reset_restores_what_set_up_left_once_the_agent_touched_it(backend):
    import dataclasses
    spec = dataclasses.replace(CALC.repo_spec(), setup_commands=("mkdir -p vendored && echo 'X = 1' > vendored/helper.py",))
    sb = backend.create(spec)
    try:
        def state():
            return sb.exec("stat -c %z vendored/helper.py | tr ' ' _; cat vendored/helper.py; ls vendored",
                           timeout=30).output.split()
        first = state()
        assert first[1:] == ["X", "=", "1", "helper.py"]
        assert sb.diff() == ""  # set-up's files are not the agent's change
        sb.reset()
        assert state() == first  # untouched: not even rewritten (same ctime)
        # Edited, back-dated with touch, a file added: set-up's state comes back anyway.
        assert sb.exec("sleep 1; echo 'X = 2' > vendored/helper.py && touch vendored/new.txt "
                       "&& touch -d 2000-01-01 vendored/helper.py", timeout=30).exit_code == 0
        assert sb.diff() == ""
        sb.reset()
        assert state()[1:] == ["X", "=", "1", "helper.py"]
        assert sb.exec("rm -rf vendored", timeout=30).exit_code == 0
        sb.reset()
        assert state()[1:] == ["X", "=", "1", "helper.py"]
    finally:
        sb.close()
