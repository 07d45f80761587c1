"""The shared exec bridge client (adapters/exec_client.py, `harnessrl-exec`): a beside harness
calls it as its shell and the command runs in a real sandbox (the local bwrap backend), with
its output and exit status exactly; the bridge refuses malformed requests naming the field."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.adapters.exec_bridge import ExecBridge
from harnessrl.adapters.proc import clean_env, run_host

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task  # noqa: E402

CLIENT = Path(__file__).resolve().parents[1] / "adapters" / "exec_client.py"
pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    from harnessrl.sandboxes import make_backend
    from harnessrl.sandboxes.local import LocalConfig
    tmp = tmp_path_factory.mktemp("exec-client")
    try:
        sb = make_backend("local", LocalConfig(root=str(tmp / "local"))).create(builtin_task().repo_spec())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"local backend unavailable here: {e}")
    sock = str(tmp / "exec.sock")
    try:
        with ExecBridge(sb, sock) as b:
            yield b, sock, sb, tmp
    finally:
        sb.close()


def _client(sock: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CLIENT), *args], capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "HARNESSRL_EXEC_SOCKET": sock, **env}, timeout=120)


def test_a_command_runs_in_the_sandbox_with_its_output_and_status_exactly(bridge):
    _, sock, sb, _ = bridge
    r = _client(sock, "-c", "echo out; echo err >&2; printf 'caf\\303\\251 no-newline'; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\nerr\ncafé no-newline".encode(), b"")
    r = _client(sock, "-c", "pwd; id -u")  # the sandbox's repo and user, not the host's
    assert r.returncode == 0 and r.stdout.decode().split() == [sb.workdir, "1000"], r
    r = _client(sock, "--cwd", "/tmp", "--", "pwd", "&&", "echo", "joined")
    assert (r.returncode, r.stdout) == (0, b"/tmp\njoined\n")
    r = _client(sock, "-c", "pwd", HARNESSRL_EXEC_CWD="/etc")
    assert r.stdout == b"/etc\n"


def test_timeouts_and_failures_have_their_own_status(bridge):
    _, sock, _, tmp = bridge
    r = _client(sock, "--timeout", "1", "-c", "sleep 30")
    assert r.returncode == 124 and b"timed out" in r.stderr
    r = _client(str(tmp / "no-such.sock"), "-c", "true")
    assert r.returncode == 125 and b"bridge" in r.stderr
    r = _client("", "-c", "true")
    assert r.returncode == 125 and b"HARNESSRL_EXEC_SOCKET is not set" in r.stderr
    r = _client(sock, "-c", "")  # refused by the bridge, named
    assert r.returncode == 125 and b"field 'command' must be a non-empty string" in r.stderr


def test_a_beside_harness_in_its_network_namespace_still_reaches_the_bridge(bridge):
    _, sock, _, tmp = bridge
    run = run_host([sys.executable, str(CLIENT), "-c", "echo from-inside; exit 7"],
                   clean_env({"HARNESSRL_EXEC_SOCKET": sock}), str(tmp), 120,
                   network="proxy-only", proxy_url="http://127.0.0.1:59999/s/x")
    assert (run.network, run.exit_code, run.stdout) == ("proxy-only", 7, "from-inside\n")
    low = run_host([sys.executable, str(CLIENT), "-c", "true"], clean_env({"HARNESSRL_EXEC_SOCKET": sock}),
                   str(tmp), 120, network="proxy-only", proxy_url="http://127.0.0.1:9/s/x")
    # no capabilities in the namespace, so no port below 1024: said, and the harness never runs
    assert low.exit_code == 126 and "cannot listen on tcp:127.0.0.1:9 for the proxy" in low.stderr


@pytest.mark.parametrize("raw, needle", [
    (b"not json\n", "not JSON"),
    (b"[1, 2]\n", "want a JSON object, got list"),
    (b'{"command": "true", "shell": "/bin/zsh"}\n', "unknown field(s) ['shell']"),
    (b'{"cwd": "/tmp"}\n', "field 'command' must be a non-empty string"),
    (b'{"command": ["ls"]}\n', "field 'command' must be a non-empty string"),
    (b'{"command": "ls", "cwd": "relative"}\n', "field 'cwd' must be an absolute path"),
    (b'{"command": "ls", "timeout": "60"}\n', "field 'timeout' must be a number"),
    (b'{"command": "ls", "timeout": -1}\n', "field 'timeout' must be a number"),
    (b'{"command": "ls", "timeout": true}\n', "field 'timeout' must be a number"),
    (b'{"command": "ls", "env": {"A": 1}}\n', "field 'env' must be an object of string values"),
    (b'{"command": "true"}', "ending in a newline"),  # half-closed before the newline
])
def test_malformed_requests_are_refused_naming_the_field(bridge, raw, needle):
    b, sock, _, _ = bridge
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock)
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        reply = json.loads(s.makefile("rb").readline())
    assert reply["bad_request"] is True and needle in reply["error"], reply
    assert b.sandbox_error is None  # a bad request is the harness's, not a sandbox failure
