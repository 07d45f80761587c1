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
  Anything else is answered {"id", "rc": -1, "err"}. A `docker exec` costs the host about
  125 ms of CPU (dockerd, containerd, a runc start); a command this way costs a fork.
"""
import binascii
import ctypes
import json
import os
import select
import signal
import sys
import time

SEND_CHUNK = 1 << 16


def _send(obj):
    data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    while data:  # stdout is the attach stream: blocking, may take a write in parts
        data = data[os.write(1, data):]


class Command:
    def __init__(self, rid, pid, out_r, err_r, limit):
        self.rid, self.pid, self.limit, self.size = rid, pid, limit, 0
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
        _send({"id": self.rid, "rc": rc, "size": self.size})


def _spawn(req):
    argv, cwd = [str(a) for a in req["argv"]], str(req.get("cwd") or "/")
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
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
    return Command(req.get("id"), pid, out_r, err_r, int(req.get("limit") or (4 << 20)))


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


def _kill_all():
    for _ in range(50):  # again, so a child forked while the first sweep ran dies too
        try:
            os.kill(-1, signal.SIGKILL)  # every process but PID 1 (the caller is spared too)
        except OSError:  # ESRCH: none is left
            return


def main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's KeyboardInterrupt handler would let it die
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    reset_argv = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
    since = time.time()  # anything changed after this (by ctime) is the agent's doing
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send({"ready": True})  # the host's start() waits for this line
    stdin_open, buf = True, b""
    commands = {}  # pid -> Command
    exited = {}  # pid -> exit code, of every reaped child not yet answered for
    while True:
        fds = [wake_r] + [fd for c in commands.values() for fd in c.fds] + ([0] if stdin_open else [])
        ready = select.select(fds, [], [], 5.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        for c in list(commands.values()):
            for fd in list(c.fds):
                if fd in ready:
                    c.pump(fd)
        _reap(exited)
        for pid in [p for p in exited if p in commands]:
            commands.pop(pid).finish(exited.pop(pid))
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
                rid, op = req.get("id"), req.get("op")
                if op == "exec":
                    c = _spawn(req)
                    commands[c.pid] = c
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
