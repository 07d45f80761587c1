"""PID 1 of every docker sandbox; runs inside the container on its own python3 (stdlib only,
3.9 or newer: a task's own image brings its own).

- Reaps orphans, so killed process trees leave no zombies.
- Handles no signal but SIGCHLD (which only wakes it up to reap): the kernel drops unhandled
  signals sent to a PID namespace's init from inside it, so the agent cannot stop its own
  sandbox (and turn a failing episode into an infra error).
- Is non-dumpable: the agent (same uid) can neither ptrace it nor open its stdin via /proc.
- Says {"ready": true} on stdout once the above holds (the host waits for it in start()).
- Serves the host over `docker attach`, the only way to reach its stdin: one JSON request per
  line, each with an `id` the replies carry, so several may be in flight.
  - {"id", "op": "exec", "argv", "env", "cwd", "limit", "merge"}: forks argv in a session of its own,
    stdin /dev/null, in cwd (exit 126 and a line saying why if it cannot go there), with the
    container's environment updated by env. Output comes back as {"id", "o": base64} and
    {"id", "e": base64} (stdout, stderr; merge: both on stdout, in order) up to `limit` bytes in all; the rest is read and
    counted, not sent. When the process has exited, what its pipes still hold is read and
    {"id", "rc", "size"} ends the request (size: bytes it wrote in all). A process it left
    behind holding the pipes (`setsid -f cmd &`) does not hold the reply: the pipes close.
  - {"id", "op": "kill"}: SIGKILL to every process but PID 1 (the host's backstop for a
    command past its deadline whose processes left its group); answers {"id", "rc": 0}.
  - {"id", "op": "reset"}: runs the reset command fixed in argv[1] (a JSON argv), with the
    time of the previous reset (or of start) appended; answers {"id", "rc", "err"}.
  - {"id", "op": "listen", "addr"}: listens on addr ("tcp:127.0.0.1:PORT" or "unix:PATH") for
    the host's tunnel (sandboxes/tunnel.py) and answers {"id", "rc": 0} (or rc -1 and "err").
    Each connection accepted there is announced as {"id", "conn": C}; its bytes travel both
    ways as {"c": C, "d": base64}, an end of writing as {"c": C, "eof": 1}, an abort as
    {"c": C, "close": 1}; the connection is closed once both sides ended writing (or on an
    abort). A harness's output unread past TUNNEL_BUFFER bytes aborts its connection (the host
    does not wait on it). {"id", "op": "unlisten", "of": L} closes listener L and its
    connections. The listeners and connections are close-on-exec: no command inherits them.
  Anything else is answered {"id", "rc": -1, "err"}. A `docker exec` costs the host about
  125 ms of CPU (dockerd, containerd, a runc start); a command this way costs a fork.
- Warm python (argv[2], JSON `{"warm": [modules]}`): PID 1 runs as `python3 -I
  --check-hash-based-pycs always` and imports those modules before its ready line, so before
  any command of the agent's, from the image's read-only paths (an entry `pkg.mod:NAMES` also
  imports `pkg.<n>` for each n in `pkg.mod.NAMES`: pytest's built-in plugins). An exec with
  `"warm": {"argv", "timeout"}` whose argv starts this same interpreter with these same flags
  and a script, and sets no environment of its own, is run by a fork of PID 1 instead of a new
  interpreter (the grader's pytest runner: ~0.2 s of CPU an episode for pytest's imports):
  the child is dumpable again as after an exec, holds only its three stdio fds, gets
  `sys.argv`, `sys.path` and `__main__` as `python3 FLAGS script` would, and exits with its
  status; at `timeout` seconds PID 1 kills its process group (status 137, as `timeout -k`'s
  SIGKILL), and kills what is left of the group when it exits (as the exec wrapper does).
  Otherwise (a warm-up that failed, another interpreter or flags) the request's plain `argv`
  runs. What a fork shares with PID 1 beyond a fresh interpreter: the string hash seed (set
  iteration order is the same in every such run; `random` is reseeded by fork); its
  environment lacks only the `SHLVL` and `_` the exec wrapper's bash adds, and it leads its
  own session and process group (a new interpreter is the child of `timeout` there).
"""
import binascii
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time

SEND_CHUNK = 1 << 16
TUNNEL_BUFFER = 16 << 20
WARM_FLAGS = ["-I", "--check-hash-based-pycs", "always"]
WARM = {"ok": False, "path": []}  # set once, before the ready line: the warm-up held, sys.path then


def _send(obj):
    data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    while data:  # stdout is the attach stream: blocking, may take a write in parts
        data = data[os.write(1, data):]


class Command:
    def __init__(self, rid, pid, out_r, err_r, limit, deadline=None):
        self.rid, self.pid, self.limit, self.size = rid, pid, limit, 0
        self.deadline = deadline  # warm runs only: PID 1 kills the group then (no `timeout` wraps them)
        self.warm = deadline is not None
        self.fds = {out_r: "o", err_r: "e"} if err_r is not None else {out_r: "o"}

    def pump(self, fd, drain=False):
        """Read what fd has (all of it, up to 64 reads, when drain); forward within the limit.
        Returns False at EOF (fd closed)."""
        for _ in range(64 if drain else 1):
            try:
                chunk = os.read(fd, SEND_CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                os.close(fd)
                del self.fds[fd]
                return False
            room = self.limit - self.size
            self.size += len(chunk)
            if room > 0:
                _send({"id": self.rid, self.fds[fd]: binascii.b2a_base64(chunk[:room], newline=False).decode()})
        return True

    def finish(self, rc):
        for fd in list(self.fds):
            if self.pump(fd, drain=True):  # still open: a left-over process holds it
                os.close(fd)
                del self.fds[fd]
        _send({"id": self.rid, "rc": rc, "size": self.size, **({"warm": True} if self.warm else {})})


class Tunnels:
    """The sandbox's end of the host's tunnels (op listen): listeners, and the connections
    accepted on them, carried over the attach stream (see the module docstring)."""

    def __init__(self):
        self.listeners = {}  # listen request id -> socket
        self.conns = {}  # connection id -> [socket, listen id, bytes to write, host ended writing, read open]
        self.next_id = 1

    def listen(self, rid, addr):
        kind, _, rest = str(addr).partition(":")
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            where = (host, int(port))
        elif kind == "unix" and rest:
            s, where = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), rest
            if os.path.exists(rest):
                os.unlink(rest)
        else:
            raise ValueError(f"bad listen address {addr!r}: want tcp:HOST:PORT or unix:PATH")
        try:
            s.bind(where)
            s.listen(128)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.listeners[rid] = s
        _send({"id": rid, "rc": 0})

    def unlisten(self, rid, of):
        s = self.listeners.pop(of, None)
        if s is not None:
            s.close()
        for cid in [c for c, v in self.conns.items() if v[1] == of]:
            self.drop(cid)
        _send({"id": rid, "rc": 0})

    def drop(self, cid, tell=False):
        conn = self.conns.pop(cid, None)
        if conn is not None:
            conn[0].close()
            if tell:
                _send({"c": cid, "close": 1})

    def read_fds(self):
        return [s for s in self.listeners.values()] + [v[0] for v in self.conns.values() if v[4]]

    def write_fds(self):
        return [v[0] for v in self.conns.values() if v[2]]

    def on_ready(self, readable, writable):
        for lid, s in list(self.listeners.items()):
            if s in readable:
                try:
                    c, _ = s.accept()
                except OSError:
                    continue
                c.setblocking(False)
                if c.family == socket.AF_INET:  # a streamed reply's chunks go out as they come
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                cid, self.next_id = self.next_id, self.next_id + 1
                self.conns[cid] = [c, lid, bytearray(), False, True]
                _send({"id": lid, "conn": cid})
        for cid, conn in list(self.conns.items()):
            s = conn[0]
            try:
                if s in writable and conn[2]:
                    del conn[2][:s.send(conn[2])]
                    self._maybe_end(cid, conn)
                if s in readable and conn[4] and cid in self.conns:
                    data = s.recv(SEND_CHUNK)
                    if data:
                        _send({"c": cid, "d": binascii.b2a_base64(data, newline=False).decode()})
                    else:
                        conn[4] = False
                        _send({"c": cid, "eof": 1})
                        self._maybe_end(cid, conn)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.drop(cid, tell=True)

    def from_host(self, msg):
        cid = msg.get("c")
        conn = self.conns.get(cid)
        if conn is None:
            return
        if msg.get("close"):
            self.drop(cid)
            return
        if "d" in msg:
            conn[2] += binascii.a2b_base64(msg["d"])
            if len(conn[2]) > TUNNEL_BUFFER:  # the harness is not reading: abort, never stall PID 1
                self.drop(cid, tell=True)
                return
        if msg.get("eof"):
            conn[3] = True
        self._maybe_end(cid, conn)

    def _maybe_end(self, cid, conn):
        if conn[3] and not conn[2]:
            try:
                conn[0].shutdown(socket.SHUT_WR)
            except OSError:
                pass
            if not conn[4]:
                self.drop(cid)


def _which(name, path):
    if "/" in name:
        return name
    for d in path.split(os.pathsep):
        f = os.path.join(d or ".", name)
        if os.path.isfile(f) and os.access(f, os.X_OK):
            return f
    return None


def _warm_script(req):
    """The script argv a fork of PID 1 may run for this request (see the module docstring), or None."""
    warm = req.get("warm")
    if not WARM["ok"] or not isinstance(warm, dict) or req.get("env"):
        return None
    argv = [str(a) for a in warm.get("argv") or []]
    if len(argv) < 5 or argv[1:4] != WARM_FLAGS or argv[4].startswith("-"):
        return None
    exe = _which(argv[0], os.environ.get("PATH", os.defpath))
    if exe is None or os.path.realpath(exe) != os.path.realpath(sys.executable):
        return None
    return argv[4:]


def _run_warm(args):
    """In the forked child, stdio in place: be `python3 FLAGS args...`, then exit with its status."""
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, 1: as a new interpreter would be
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a new interpreter sets up
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    os.environ["PWD"] = os.getcwd()  # as the exec wrapper's bash exports it (SHLVL and `_` are all it adds besides)
    sys.argv = list(args)
    script_dir = [] if getattr(sys.flags, "safe_path", False) else [os.path.dirname(os.path.abspath(args[0]))]
    sys.path[:] = script_dir + WARM["path"]
    code = 0
    try:
        import runpy
        runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:
        code = 0 if e.code is None else e.code
        if not isinstance(code, int):  # a message: python flushes stdout, prints it, exits 1
            _flush(sys.stdout)
            print(code, file=sys.stderr)
            code = 1
    except BaseException as e:  # noqa: BLE001 - printed as python prints it, from the script's frames on
        _flush(sys.stdout)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != args[0]:
            tb = tb.tb_next
        if tb is not None:
            e.__traceback__ = tb
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            code = code or 120
    os._exit(code & 0xFF)


def _flush(stream):
    try:
        stream.flush()
    except Exception:  # noqa: BLE001
        pass


def _spawn(req):
    argv, cwd = [str(a) for a in req["argv"]], str(req.get("cwd") or "/")
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    script = _warm_script(req)
    deadline = time.monotonic() + float(req["warm"].get("timeout") or 60.0) if script else None
    out_r, out_w = os.pipe()
    err_r, err_w = (None, out_w) if req.get("merge") else os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of PID 1 but the pipes may reach the command
        try:
            os.setsid()
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):  # Python
                signal.signal(sig, signal.SIG_DFL)  # ignores the last two, and exec would keep that
            signal.set_wakeup_fd(-1)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            try:
                os.chdir(cwd)
            except OSError as e:
                os.write(2, f"harnessrl: cannot run in {cwd}: {e.strerror}\n".encode())
                os._exit(126)
            if script:
                _run_warm(script)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:  # noqa: BLE001 - the child must never return into the loop
            try:
                os.write(2, f"harnessrl: cannot run {argv[:1]}: {e}\n".encode())
            finally:
                os._exit(127)
    for fd in {out_w, err_w}:
        os.close(fd)
    for fd in (out_r, err_r):
        if fd is not None:
            os.set_blocking(fd, False)
    return Command(req.get("id"), pid, out_r, err_r, int(req.get("limit") or (4 << 20)), deadline)


def _reap(exited, wanted=None):
    """Reap every exited child into `exited` (pid -> exit code); block until `wanted` has."""
    while True:
        block = wanted is not None and wanted not in exited
        try:  # (EINTR is retried by Python itself, PEP 475, here and in every call below)
            pid, st = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(st)
        exited[pid] = code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says


def _reset(argv, exited):
    r, w = os.pipe()
    pid = os.posix_spawnp(argv[0], argv, dict(os.environ), file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, w, 2), (os.POSIX_SPAWN_CLOSE, r), (os.POSIX_SPAWN_CLOSE, w)])
    os.close(w)
    err = b""
    while chunk := os.read(r, 65536):
        err += chunk[:8192]
    os.close(r)
    _reap(exited, pid)
    return {"rc": exited.pop(pid), "err": err.decode("utf-8", "replace")[-4000:]}


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # ESRCH: nothing is left in it
        pass


def _kill_all():
    for _ in range(50):  # again, so a child forked while the first sweep ran dies too
        try:
            os.kill(-1, signal.SIGKILL)  # every process but PID 1 (the caller is spared too)
        except OSError:  # ESRCH: none is left
            return


def _warm_up(modules):
    """Import `modules` (see the module docstring); True when all of them came in."""
    import importlib
    cwd = os.getcwd()  # `-c` puts '' (the cwd: the repository) first on sys.path before 3.11
    WARM["path"] = [p for p in sys.path if p and p not in (".", cwd)]
    sys.path[:] = WARM["path"]
    try:
        for entry in modules:
            name, _, listed = str(entry).partition(":")
            mod = importlib.import_module(name)
            for sub in (getattr(mod, listed) if listed else ()):
                try:
                    importlib.import_module(f"{name.rpartition('.')[0]}.{sub}")
                except ImportError:
                    pass  # a plugin this version does not have: the runner skips it too
    except Exception:  # noqa: BLE001 - no warm runs then: every python is a new interpreter
        return False
    return sys.flags.isolated == 1 and importlib.import_module("_imp").check_hash_based_pycs == "always"


def main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's KeyboardInterrupt handler would let it die
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    reset_argv = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
    options = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if options.get("warm"):
        WARM["ok"] = _warm_up(options["warm"])
        import gc
        gc.collect()
        gc.freeze()  # the forks' collections skip (so do not copy) the warm heap
    since = time.time()  # anything changed after this (by ctime) is the agent's doing
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send({"ready": True, "warm": WARM["ok"]})  # the host's start() waits for this line
    stdin_open, buf = True, b""
    commands = {}  # pid -> Command
    exited = {}  # pid -> exit code, of every reaped child not yet answered for
    tunnels = Tunnels()
    while True:
        fds = [wake_r] + [fd for c in commands.values() for fd in c.fds] + ([0] if stdin_open else [])
        deadlines = [c.deadline for c in commands.values() if c.deadline is not None]
        wait = min([5.0] + [max(0.0, d - time.monotonic()) for d in deadlines])
        ready, writable, _ = select.select(fds + tunnels.read_fds(), tunnels.write_fds(), [], wait)
        tunnels.on_ready(ready, writable)
        for c in commands.values():
            if c.deadline is not None and time.monotonic() >= c.deadline:
                _kill_group(c.pid)  # a warm run past its timeout: the whole group, as `timeout -k` would
                c.deadline = None
        if wake_r in ready:
            os.read(wake_r, 4096)
        for c in list(commands.values()):
            for fd in list(c.fds):
                if fd in ready:
                    c.pump(fd)
        _reap(exited)
        for pid in [p for p in exited if p in commands]:
            c = commands.pop(pid)
            if c.warm:
                _kill_group(pid)  # what the warm run left in its group (the exec wrapper's job otherwise)
            c.finish(exited.pop(pid))
        exited.clear()  # orphans reparented to us: nobody asks for them
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            stdin_open = False
            continue
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            rid = None
            try:  # PID 1 must never die
                req = json.loads(line)
                if "c" in req:  # tunnel bytes: the hottest path first
                    tunnels.from_host(req)
                    continue
                rid, op = req.get("id"), req.get("op")
                if op == "exec":
                    c = _spawn(req)
                    commands[c.pid] = c
                elif op == "listen":
                    tunnels.listen(rid, req.get("addr"))
                elif op == "unlisten":
                    tunnels.unlisten(rid, req.get("of"))
                elif op == "kill":
                    _kill_all()
                    _send({"id": rid, "rc": 0})
                elif op == "reset" and reset_argv:
                    reply = _reset([*reset_argv, f"{since:.6f}"], exited)
                    since = time.time()  # the last reset's time, from memory the agent cannot reach
                    _send({"id": rid, **reply})
                else:
                    _send({"id": rid, "rc": -1, "err": f"unknown request {line[:80]!r}"})
            except Exception as e:  # noqa: BLE001
                _send({"id": rid, "rc": -1, "err": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
