"""Serve `Sandbox.exec` to a harness process running beside the sandbox, over a unix socket.

Why: a beside harness (mini-swe-agent) is a separate process in its own venv, while the
episode's `Sandbox` object lives in harnessrl's process. The harness's environment class
(adapters/mini_env.py) sends each command here, and it runs in the sandbox through the
Sandbox protocol, so the same harness works with every sandbox backend.

Wire format, one exchange per connection: the client sends one JSON line (at most
MAX_REQUEST bytes) `{"command": str, "cwd": str|null, "timeout": number, "env": {str: str}}`
(only `command` is required; `cwd` absolute, in the sandbox; `timeout` seconds > 0, capped at
the bridge's `max_timeout`, default 60) and reads one JSON line
`{"output": str, "returncode": int, "timed_out": bool}` (`output`: stdout and stderr
interleaved, as `Sandbox.exec` gives them; `returncode` -1 when killed for its timeout), or
`{"error": str, "bad_request": true}` for a malformed request (the message names the field),
or `{"error": str}` when the sandbox itself failed (the harness then stops with a crash, and
the runner checks the sandbox). adapters/exec_client.py is a client any beside harness can
call as its shell.
"""
from __future__ import annotations

import json
import os
import socketserver
import threading

from harnessrl.sandboxes.base import Sandbox, SandboxError

MAX_REQUEST = 16 << 20
FIELDS = ("command", "cwd", "timeout", "env")


class BadRequest(ValueError):
    """A malformed exec request; the message names the field."""


def parse_request(line: bytes) -> dict:
    """The request of one JSON line, checked field by field (BadRequest names what is wrong)."""
    if not line.endswith(b"\n"):
        raise BadRequest(f"want one JSON object on one line ending in a newline, at most {MAX_REQUEST} bytes")
    try:
        req = json.loads(line)
    except ValueError as e:
        raise BadRequest(f"not JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest(f"want a JSON object, got {type(req).__name__}")
    unknown = sorted(set(req) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; known: {list(FIELDS)}")
    command, cwd, timeout, env = req.get("command"), req.get("cwd"), req.get("timeout"), req.get("env")
    if not isinstance(command, str) or not command.strip():
        raise BadRequest("field 'command' must be a non-empty string")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise BadRequest("field 'cwd' must be an absolute path or null")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < float("inf")):
        raise BadRequest("field 'timeout' must be a number of seconds > 0 or null")
    if env is not None and (not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                 for k, v in env.items())):
        raise BadRequest("field 'env' must be an object of string values or null")
    return {"command": command, "cwd": cwd, "timeout": timeout, "env": env or {}}


class ExecBridge:
    """A unix-socket server running commands in one sandbox. Use as a context manager."""

    def __init__(self, sandbox: Sandbox, socket_path: str, max_timeout: float = 600.0):
        self.sandbox = sandbox
        self.socket_path = socket_path
        self.max_timeout = max_timeout
        self.calls = 0
        self.sandbox_error: str | None = None
        bridge = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    reply = bridge._run(parse_request(self.rfile.readline(MAX_REQUEST)))
                except BadRequest as e:
                    reply = {"error": f"bad exec request: {e}", "bad_request": True}
                try:
                    self.wfile.write(json.dumps(reply).encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the harness went away (killed on a timeout or cancel) before the reply

        if os.path.exists(socket_path):
            os.unlink(socket_path)
        self._server = socketserver.ThreadingUnixStreamServer(socket_path, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="harnessrl-exec-bridge")

    def _run(self, req: dict) -> dict:
        self.calls += 1
        timeout = min(float(req["timeout"] or 60), self.max_timeout)
        try:
            res = self.sandbox.exec(req["command"], timeout=timeout, env=req["env"] or None,
                                    workdir=req["cwd"] or None)
        except SandboxError as e:
            self.sandbox_error = f"{type(e).__name__}: {e}"
            return {"error": self.sandbox_error}
        return {"output": res.output, "returncode": res.exit_code, "timed_out": res.timed_out}

    def __enter__(self) -> "ExecBridge":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
