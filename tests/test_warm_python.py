"""Warm python in Docker sandboxes (sandboxes/sandbox_init.py, DockerConfig.warm_python): PID 1
imports pytest before any command, and `python3 -I --check-hash-based-pycs always SCRIPT`
(the grader's runner) then runs in a fork of it. The fork must be what a new interpreter would
be, end as one does, die at its timeout with its whole group, and be used only when it can be
exactly that; the grader's verdicts are the same either way."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from harnessrl.sandboxes import RepoSpec
from harnessrl.sandboxes.docker import WARM_PYTHON_FLAGS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repo_helpers import one_commit_repo  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

PROBE = r'''
import ctypes, json, os, signal, sys
early = sorted(m for m in ("pytest", "_pytest.python", "pluggy") if m in sys.modules)
import pytest
libc = ctypes.CDLL(None)
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "name": __name__,
    "env": dict(os.environ), "fds": sorted(os.listdir("/proc/self/fd")),
    "dumpable": libc.prctl(3, 0, 0, 0, 0), "isolated": sys.flags.isolated,
    "signals": {s: str(signal.getsignal(getattr(signal, s))) for s in ("SIGINT", "SIGPIPE", "SIGXFSZ", "SIGCHLD")},
    "pytest": pytest.__file__, "early": early, "leader": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
}))
'''


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    from harnessrl.sandboxes.docker import DockerBackend, DockerConfig
    repo = tmp_path_factory.mktemp("warm") / "repo"
    base = one_commit_repo(repo, {"calc.py": "def add(a, b):\n    return a + b\n"})
    spec = RepoSpec(repo_id="warm-python", source=str(repo), base_commit=base)
    run_id = f"warm-{uuid.uuid4().hex[:8]}"
    try:
        warm = DockerBackend(DockerConfig(run_id=run_id))
        cold = DockerBackend(DockerConfig(run_id=run_id, warm_python=()))
    except Exception as e:
        pytest.skip(f"docker backend unavailable here: {e}")
    made = []

    def create(kind):
        sb = (warm if kind == "warm" else cold).create(spec)
        made.append(sb)
        return sb
    yield create
    for sb in made:
        sb.close()


def _python(sb, script: str, *args: str, timeout: float = 60, flags=WARM_PYTHON_FLAGS, env=None):
    path = f"/tmp/probe-{uuid.uuid4().hex[:6]}.py"
    sb.write_file(path, script.encode())
    return path, sb.exec(["python3", *flags, path, *args], timeout=timeout, env=env)


def test_a_warm_run_is_what_a_new_interpreter_gives_but_with_pytest_already_imported(backends):
    got = {}
    for kind in ("warm", "cold"):
        sb = backends(kind)
        sb.write_file("pytest.py", b"raise SystemExit('the agent shadowed pytest')\n")  # in the cwd
        before = sb.warm_runs
        path, res = _python(sb, PROBE, "a b", "--c")
        assert res.exit_code == 0, res.output
        assert sb.warm_runs - before == (kind == "warm")
        got[kind] = json.loads(res.output.replace(path, "SCRIPT"))
    warm, cold = got["warm"], got["cold"]
    assert warm["early"] == ["_pytest.python", "pluggy", "pytest"] and cold["early"] == []
    for kind in (warm, cold):  # the container's own name; what the exec wrapper's bash adds besides PWD
        kind["env"] = {k: v for k, v in kind["env"].items() if k not in ("HOSTNAME", "SHLVL", "_")}
    for field in ("argv", "path", "cwd", "name", "env", "fds", "dumpable", "isolated", "signals", "pytest", "stdin"):
        assert warm[field] == cold[field], field
    # The one process-tree difference: the fork leads its session (bash and `timeout` did before).
    assert (warm["leader"], cold["leader"]) == (True, False)
    assert warm["argv"] == ["SCRIPT", "a b", "--c"] and warm["name"] == "__main__"
    assert warm["env"]["PWD"] == warm["cwd"] == "/workspace/repo" and warm["env"]["HOME"] == "/home/agent"
    assert warm["fds"] == ["0", "1", "2", "3"]  # stdio and the listdir's own: nothing of PID 1's
    assert warm["dumpable"] == 1 and warm["isolated"] == 1 and warm["stdin"] == "/dev/null"
    assert warm["pytest"].startswith("/usr/lib/") and warm["signals"]["SIGPIPE"] == str(int(signal.SIG_IGN))


@pytest.mark.parametrize("tail,code", [("", 0), ("raise ValueError('boom')", 1), ("import sys; sys.exit(3)", 3),
                                       ("import sys; sys.exit('bye')", 1), ("import sys; sys.exit(-1)", 255)])
def test_a_warm_run_ends_with_the_status_and_output_of_a_new_interpreter(backends, tail, code):
    script = (f"import sys\nprint('out', flush=True)\nprint('err', file=sys.stderr)\n"
              f"sys.stdout.write('unflushed')\n{tail}\n")
    outs = {}
    for kind in ("warm", "cold"):
        sb = backends(kind)
        path, res = _python(sb, script)
        outs[kind] = (res.exit_code, res.output.replace(path, "SCRIPT"))
    assert outs["warm"] == outs["cold"]
    assert outs["warm"][0] == code and outs["warm"][1].startswith("out\n")
    if "ValueError" in tail:
        assert 'File "SCRIPT", line 5, in <module>' in outs["warm"][1] and "sandbox_init" not in outs["warm"][1]


def _sleeping(sb, seconds: str) -> int:
    """Processes in the sandbox running `sleep <seconds>` (its image has no pgrep)."""
    count = ("import os\nn = 0\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
             "        n += open(f'/proc/{p}/cmdline').read() == 'sleep\\0' + os.environ['S'] + '\\0'\n"
             "    except OSError:\n        pass\nprint(n)\n")
    res = sb.exec(["python3", "-c", count], env={"S": seconds})
    assert res.exit_code == 0, res.output
    return int(res.output)


def test_a_warm_run_dies_at_its_timeout_with_its_group_and_leaves_nothing_behind(backends):
    sb = backends("warm")
    # The count below sees a process that outlives its command (which waits until setsid has
    # left its group: the wrapper kills the group when the command ends).
    sb.exec("setsid -f sleep 4323; sleep 1")
    deadline = time.monotonic() + 10
    while _sleeping(sb, "4323") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleeping(sb, "4323") == 1
    before = sb.warm_runs
    hang = ("import subprocess, time\nsubprocess.Popen(['sleep', '4321'])\nprint('started', flush=True)\n"
            "time.sleep(600)\n")
    _, res = _python(sb, hang, timeout=3)
    assert res.timed_out and res.exit_code == -1 and res.output.startswith("started")
    assert res.duration_s < 20 and sb.warm_runs == before + 1
    assert _sleeping(sb, "4321") == 0
    # A run that ends leaving a child in its group: the group goes with it, as the exec wrapper's.
    _, res = _python(sb, "import subprocess\nsubprocess.Popen(['sleep', '4322'])\n")
    assert res.exit_code == 0 and not res.timed_out
    # SIGKILL is sent before the reply; on a loaded machine the killed process may not have run
    # its exit yet when the next command looks (one suite run saw it once)
    deadline = time.monotonic() + 10
    while _sleeping(sb, "4322") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sleeping(sb, "4322") == 0
    assert sb.exec("echo served").output == "served\n"


def test_only_the_exact_interpreter_and_flags_with_no_env_of_its_own_run_warm(backends):
    sb = backends("warm")
    n = sb.warm_runs
    for kw in ({"env": {"X": "1"}}, {"flags": ("-I",)}, {"flags": ("-I", "--check-hash-based-pycs", "default")}):
        _, res = _python(sb, "print('ran')\n", **kw)
        assert res.exit_code == 0 and res.output == "ran\n" and sb.warm_runs == n, kw
    res = sb.exec(["python3", *WARM_PYTHON_FLAGS, "-c", "print('c')"])
    assert res.output == "c\n" and sb.warm_runs == n
    res = sb.exec(["/usr/bin/python3", *WARM_PYTHON_FLAGS, "-c", "import sys; print(sys.executable)"])
    assert res.exit_code == 0 and sb.warm_runs == n
    _, res = _python(sb, "print('warm')\n")
    assert res.output == "warm\n" and sb.warm_runs == n + 1
