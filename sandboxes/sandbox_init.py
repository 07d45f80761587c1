"""PID 1 of every docker sandbox; runs inside the container on its own python3 (stdlib only).

- Reaps orphans, so killed process trees leave no zombies.
- Handles no signal but SIGCHLD (which only wakes it up to reap): the kernel drops unhandled
  signals sent to a PID namespace's init from inside it, so the agent cannot stop its own
  sandbox (and turn a failing episode into an infra error).
- Is non-dumpable: the agent (same uid) can neither ptrace it nor open its stdin via /proc.
- Says {"ready": true} on stdout once the above holds (the host waits for it in start()).
- Serves the host over `docker attach`: each line "reset" on stdin runs the reset command
  fixed in argv[1] (a JSON argv), with the time of the previous reset (or of start) appended,
  and answers one JSON line {"rc": int, "err": str} on stdout.
  Nothing else is accepted. This saves the host a `docker exec` (a runc start) per reset,
  which is most of a warm pool's hand-over time.
"""
import ctypes
import json
import os
import select
import signal
import sys
import time


def _reap(wanted=None):
    """Reap every exited child; block until `wanted` has exited if given. Returns its status."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, 0 if wanted and status is None else os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == wanted:
            status = os.waitstatus_to_exitcode(st)


def _run(argv):
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
    return {"rc": _reap(pid), "err": err.decode("utf-8", "replace")[-4000:]}


def main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's KeyboardInterrupt handler would let it die
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    reset_argv = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
    since = time.time()  # anything changed after this (by ctime) is the agent's doing
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    os.write(1, b'{"ready": true}\n')  # the host's start() waits for this line
    stdin_open, buf = True, b""
    while True:
        ready = select.select([0, wake_r] if stdin_open else [wake_r], [], [], 5.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap()
        if 0 not in ready:
            continue
        data = os.read(0, 4096)
        if not data:
            stdin_open = False
            continue
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip() == b"reset" and reset_argv:
                try:  # the last reset's time, from memory the agent cannot reach (see module doc)
                    reply = _run([*reset_argv, f"{since:.6f}"])
                    since = time.time()
                except Exception as e:  # PID 1 must never die
                    reply = {"rc": -1, "err": f"{type(e).__name__}: {e}"}
            else:
                reply = {"rc": -1, "err": f"unknown request {line[:80]!r}"}
            os.write(1, json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    main()
