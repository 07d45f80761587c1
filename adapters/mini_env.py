"""mini-swe-agent environment class that runs every command in harnessrl's episode sandbox.

Loaded *inside mini-swe-agent's own process* (its venv, not harnessrl's): the adapter copies
this file next to the run as `harnessrl_mini_env.py`, puts it on PYTHONPATH and passes
`--environment-class harnessrl_mini_env.SandboxEnvironment`. Stdlib + minisweagent only.
Commands go over the exec bridge socket (adapters/exec_bridge.py); completion is detected
exactly as mini-swe-agent's own LocalEnvironment does (first output line
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT with exit 0 raises `Submitted`).
"""
import json
import platform
import socket


class SandboxEnvironment:
    def __init__(self, *, exec_socket: str, cwd: str = "", env: dict | None = None, timeout: int = 60, **_ignored):
        self.exec_socket = exec_socket
        self.cwd = cwd
        self.env = dict(env or {})
        self.timeout = timeout

    def _call(self, req: dict) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.exec_socket)
            s.sendall(json.dumps(req).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        reply = self._call({"command": action.get("command", ""), "cwd": cwd or self.cwd or None,
                            "timeout": timeout or self.timeout, "env": self.env})
        if "error" in reply:  # the sandbox itself failed: stop the agent, it cannot continue
            raise RuntimeError(f"harnessrl sandbox failed: {reply['error']}")
        output = {"output": reply["output"], "returncode": reply["returncode"], "exception_info": ""}
        if reply.get("timed_out"):
            output["exception_info"] = f"The command timed out after {timeout or self.timeout} s."
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        from minisweagent.exceptions import Submitted

        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs) -> dict:
        from minisweagent.utils.serialize import recursive_merge

        mine = {"cwd": self.cwd, "env": self.env, "timeout": self.timeout}
        return recursive_merge(mine, platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": {"cwd": self.cwd, "env": self.env, "timeout": self.timeout},
                                    "environment_type": "harnessrl_mini_env.SandboxEnvironment"}}}
