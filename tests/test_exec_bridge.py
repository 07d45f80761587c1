"""The exec bridge (adapters/exec_bridge.py) runs a beside harness's commands in the sandbox;
a harness killed mid-command (a timeout, a cancel) must not leave a traceback in the log."""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task  # noqa: E402


@pytest.mark.bwrap
@pytest.mark.timeout(120)
def test_a_command_runs_and_a_client_gone_before_the_reply_is_quiet(tmp_path, capfd):
    from harnessrl.adapters.exec_bridge import ExecBridge
    from harnessrl.sandboxes import make_backend
    from harnessrl.sandboxes.local import LocalConfig
    try:
        backend = make_backend("local", LocalConfig(root=str(tmp_path / "local")))
        sb = backend.create(builtin_task().repo_spec())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"local backend unavailable here: {e}")
    sock = str(tmp_path / "exec.sock")
    try:
        with ExecBridge(sb, sock) as bridge:
            def ask(command: str) -> socket.socket:
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.connect(sock)
                c.sendall(json.dumps({"command": command, "timeout": 30}).encode() + b"\n")
                return c
            c = ask("echo hi; exit 4")
            reply = json.loads(c.makefile().readline())
            c.close()
            assert (reply["output"].strip(), reply["returncode"], reply["timed_out"]) == ("hi", 4, False)
            ask("sleep 1; echo late").close()  # the harness dies while its command runs
            deadline = time.monotonic() + 20
            while bridge.calls < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)
            c = ask("echo still")
            assert json.loads(c.makefile().readline())["output"].strip() == "still"
            c.close()
    finally:
        sb.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
