"""Serve `Sandbox.exec` to a harness process running beside the sandbox, over a unix socket.

Why: a beside harness (mini-swe-agent) is a separate process in its own venv, while the
episode's `Sandbox` object lives in harnessrl's process. The harness's environment class
(adapters/mini_env.py) sends each command here, and it runs in the sandbox through the
Sandbox protocol, so the same harness works with every sandbox backend.

Wire format, one exchange per connection: the client sends one JSON line
`{"command": str, "cwd": str|null, "timeout": float, "env": {str: str}}` and reads one JSON
line `{"output": str, "returncode": int, "timed_out": bool}` or `{"error": str}` when the
sandbox itself failed (the harness then stops with a crash, and the runner checks the sandbox).
"""
from __future__ import annotations

import json
import os
import socketserver
import threading

from harnessrl.sandboxes.base import Sandbox, SandboxError


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
                    req = json.loads(self.rfile.readline())
                    reply = bridge._run(req)
                except (ValueError, KeyError, TypeError) as e:
                    reply = {"error": f"bad exec request: {e}"}
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
        timeout = min(float(req.get("timeout") or 60), self.max_timeout)
        env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
        try:
            res = self.sandbox.exec(str(req["command"]), timeout=timeout, env=env or None,
                                    workdir=req.get("cwd") or None)
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
