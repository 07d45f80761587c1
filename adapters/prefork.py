"""Pre-forked harness interpreters: a beside harness written in Python starts from a warm copy
of its own interpreter that already imported its heavy dependencies, instead of importing them
again for every episode (mini-swe-agent's `import litellm` is 8-11 s of CPU on this machine,
paid by each episode on the cores the engine decodes on).

The harness stays unmodified: its console script runs as `__main__` in a child forked from a
server (adapters/prefork_server.py) that runs in the harness's own venv, with the argv, the
whole environment, the cwd, the `sys.path` and the stdio a plain launch would give it; it
leads its own session, so `proc.kill_tree` treats it as it treats a plain one. It ends as the
interpreter would (exit status, the traceback of an uncaught exception, non-daemon threads
joined, atexit handlers, stdio and open buffered files flushed) and then leaves with
`os._exit`: the teardown of the heap it shares with the server is skipped (for mini-swe-agent
0.15-0.3 s of CPU and ~30k copy-on-write page faults an episode, to free memory the exit frees
anyway). What that skips is only finalizers of objects still alive at exit (`__del__`), e.g. a
`NamedTemporaryFile` never closed stays on disk.

What could differ from a plain launch is import-time state, so the server is keyed by
everything that could shape it (interpreter, preload, and the environment minus the `late`
keys the adapter names as per episode: key, scratch HOME, PYTHONPATH) and refuses to serve
(the launch falls back to a plain one and `HostRun.launch` says why) when the preload read a
late key outside the stdlib's user-site lookup, started a thread, or failed to import.
Set HARNESSRL_PREFORK=0 to launch every harness plainly.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harnessrl.adapters import netns
from harnessrl.sandboxes.limits import env_nice, yield_cpu

SERVER = Path(__file__).with_name("prefork_server.py")
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Prefork:
    """How an adapter asks for a pre-forked launch."""

    preload: tuple[str, ...]
    """Modules the server imports once (e.g. ("litellm",)); the harness's own stay per episode."""
    late: tuple[str, ...] = ()
    """Environment keys that differ per episode; the preload must not read them at import."""
    optional: tuple[str, ...] = ()
    """Modules imported after `preload` when present (a `ModuleNotFoundError` for one of them
    skips it, so another release of the harness's dependencies still forks): what the harness
    would otherwise import in every episode, at start-up or lazily on its first model call
    (litellm's provider modules and HTTP stack). The same checks apply to them."""
    complete_models: tuple[str, ...] = ()
    """Top-level packages whose pydantic models deferred building their schema (`defer_build`:
    litellm's and openai's response types): the server builds them once, after the imports,
    so a child does not build the ones its first model call validates (0.1 s of CPU an
    episode for mini-swe-agent). A model whose forward references do not resolve yet stays
    deferred and builds in the child, as it would have."""


class PreforkUnavailable(RuntimeError):
    """No fork server for this launch; the message says why (the launch goes plain)."""


def enabled() -> bool:
    return os.environ.get("HARNESSRL_PREFORK", "1") != "0"


def interpreter_of(script: str) -> str:
    """The absolute interpreter a console script's `#!` line names (pip writes that form)."""
    try:
        with open(script, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace").strip()
    except OSError as e:
        raise PreforkUnavailable(f"cannot read {script}: {e}") from None
    python = first[2:].strip() if first.startswith("#!") else ""
    if not python.startswith("/") or " " in python or not os.access(python, os.X_OK):
        raise PreforkUnavailable(f"{script} does not start with `#!/abs/path/python` ({first[:80]!r})")
    return python


class ForkServer:
    """One server process: started with `env` (late keys removed), then serves forks. With
    `offline` it runs in a network namespace of its own (adapters/netns.py), and so does every
    harness it forks; each launch names the proxy it may reach, which the server relays."""

    def __init__(self, python: str, prefork: Prefork, env: dict[str, str], offline: bool = False) -> None:
        self._dir = tempfile.mkdtemp(prefix="harnessrl-prefork-")
        self.socket_path = os.path.join(self._dir, "s")
        self._log = open(os.path.join(self._dir, "server.log"), "wb")
        spec = {"socket": self.socket_path, "preload": list(prefork.preload), "late": list(prefork.late),
                "optional": list(prefork.optional), "complete_models": list(prefork.complete_models)}
        argv = [python, str(SERVER), json.dumps(spec)]
        self.offline = offline
        self._proc = subprocess.Popen(netns.isolate(argv) if offline else argv, env=env, cwd=self._dir,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      start_new_session=True)
        yield_cpu(self._proc.pid)  # its import (seconds of CPU) yields to the engine too
        self._ready = threading.Event()
        self.refusal: str | None = None
        """Why it will not serve (None while it does, or has not answered yet)."""
        self.skipped: list[str] = []
        """The optional modules the harness's venv does not have (set once it is ready)."""
        threading.Thread(target=self._handshake, daemon=True, name="prefork-handshake").start()

    def _handshake(self) -> None:
        line = self._proc.stdout.readline()
        try:
            hello = json.loads(line)
        except ValueError:
            hello = {"ok": False, "reason": f"server exited before it was ready: {self._log_tail()}"}
        if not hello.get("ok"):
            self.refusal = hello.get("reason") or "server refused"
        self.skipped = list(hello.get("skipped") or [])
        self._ready.set()

    def _log_tail(self) -> str:
        self._log.flush()
        try:
            return Path(self._log.name).read_text(errors="replace")[-600:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        if not self._ready.wait(timeout):
            raise PreforkUnavailable(f"fork server not ready after {timeout:.0f} s")
        if self.refusal:
            raise PreforkUnavailable(self.refusal)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, stdout: int, stderr: int,
              ready_timeout: float = START_TIMEOUT_S, proxy_url: str | None = None) -> ForkedProc:
        """Fork one harness; `proxy_url`: the proxy an offline server's child may reach."""
        self.wait_ready(ready_timeout)
        nice = env_nice()  # the child leads a new session: it sets its own priority (limits.yield_cpu)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        payload = json.dumps({"argv": argv, "env": env, "cwd": cwd,
                              "nice": min(19, mine + nice), "group_nice": nice,
                              "relay": netns.relay_spec(proxy_url) if self.offline else None}).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        devnull = os.open(os.devnull, os.O_RDONLY)
        lines = _Lines(conn)
        try:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [struct.pack("!Q", len(payload))], [devnull, stdout, stderr])
            conn.sendall(payload)
            reply = json.loads(lines.next(START_TIMEOUT_S) or b"{}")
        except (OSError, ValueError) as e:
            conn.close()
            raise PreforkUnavailable(f"fork server did not answer: {type(e).__name__}: {e}") from None
        finally:
            os.close(devnull)
        if "pid" not in reply:
            conn.close()
            raise PreforkUnavailable(f"fork server refused the launch: {reply.get('error', reply)}")
        return ForkedProc(int(reply["pid"]), lines)

    def close(self) -> None:
        """End the server (EOF on its stdin): it kills what it still runs, then exits."""
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def pid(self) -> int:
        return self._proc.pid


class _Lines:
    """Newline-framed JSON replies on the server connection."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self._buf = conn, b""

    def next(self, timeout: float | None) -> bytes | None:
        """The next line; None when `timeout` passed first; b"" at EOF."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            if deadline is not None and not select.select([self.conn], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            got = self.conn.recv(4096)
            if not got:
                return b""
            self._buf += got
        line, _, self._buf = self._buf.partition(b"\n")
        return line


class ForkedProc:
    """A forked harness, as much of `subprocess.Popen` as `proc.run_host` uses. A thread waits
    for the server's `returncode` line, so `poll` never blocks behind `wait`."""

    def __init__(self, pid: int, lines: _Lines) -> None:
        self.pid, self._lines = pid, lines
        self.returncode: int | None = None
        self._ended = threading.Event()
        threading.Thread(target=self._await_end, daemon=True, name=f"prefork-{pid}").start()

    def _await_end(self) -> None:
        try:
            line = self._lines.next(None)
        except OSError:
            line = b""
        if line:
            self.returncode = int(json.loads(line)["returncode"])
        else:  # the server died and the child is orphaned: wait for it as a stranger
            try:
                psutil.Process(self.pid).wait(None)
            except psutil.NoSuchProcess:
                pass
            self.returncode = -1
        self._lines.conn.close()
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("forked harness", timeout)
        return self.returncode


# -- one server per (interpreter, preload, environment minus late keys) ------------------------
_lock = threading.Lock()
_servers: dict[tuple, ForkServer] = {}


def server_for(python: str, prefork: Prefork, env: dict[str, str], offline: bool = False) -> ForkServer:
    """The server for this launch; `offline`: one in its own network namespace (for
    proxy-only launches), else one in the host's network."""
    base = {k: v for k, v in env.items() if k not in prefork.late}
    key = (python, prefork, tuple(sorted(base.items())), offline)
    with _lock:
        server = _servers.get(key)
        if server is not None and server.refusal is None and server._proc.poll() is not None:
            server.close()  # it died (killed, out of memory): start another
            server = None
        if server is None:
            server = _servers[key] = ForkServer(python, prefork, base, offline)
    return server


def warm(script: str, prefork: Prefork, env: dict[str, str], offline: bool = False) -> ForkServer | None:
    """Start the server a launch of `script` with `env` would use, without waiting for it (a
    server that will refuse, or prefork turned off, costs nothing more here)."""
    if enabled():
        try:
            return server_for(interpreter_of(script), prefork, env, offline)
        except (PreforkUnavailable, netns.NetnsUnavailable):
            pass
    return None


def close_all() -> None:
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.close()


atexit.register(close_all)
