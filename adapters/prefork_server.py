"""The fork server's own side: run by a harness's interpreter, stdlib only (it imports nothing
of harnessrl, whose venv it is not in). See adapters/prefork.py for the contract.

    python prefork_server.py '{"socket": PATH, "preload": [...], "late": [...], "optional": [...],
                               "complete_models": [...]}'

Start-up: import the preload modules, then the optional ones (one that is not installed is
skipped), build the deferred schemas of the pydantic models of the `complete_models` packages,
while recording which `late` environment keys they read (and from which module),
then refuse (one JSON line on stdout, `ok: false` and the reason) if a late key was read
outside `ALLOWED_READERS`, a thread was started or an import failed; else freeze the heap,
listen and say `{"ok": true, "pid": N, "skipped": [the optional modules not installed]}`.

Each connection sends an 8-byte length with three fds (stdin, stdout, stderr), then a JSON
`{"argv", "env", "cwd", "nice", "group_nice", "relay"}`; argv[0] is the console script; `relay`
(optional, `[LISTEN, TARGET]`: a server run in a beside harness's network namespace, see
harnessrl's adapters/netns.py) makes the server keep a relay (adapters/relay.py, a process of
its own that dies with it) listening on LISTEN before the child starts; the child takes
the nice value and sets its session group's to `group_nice` (see harnessrl's
`sandboxes.limits.yield_cpu`). The server forks; the child leads a
new session, takes the fds, the whole environment, the cwd and `sys.path` a plain
`python argv[0]` would have, and runs the script as `__main__`, so the interpreter exits as
it would (exit status, traceback, thread joins, atexit, flushes; then `os._exit`, without
the heap's teardown: see adapters/prefork.py). The server answers `{"pid": N}` and, when it has
reaped the child, `{"returncode": rc}` (negative: killed by that signal). EOF on its stdin
(its owner is gone) kills every child's process group and ends the server.
"""
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading

#: Who may read a late key at import: the stdlib computing the user site from HOME (a venv
#: disables user site; the child drops those caches so they are recomputed from its HOME).
ALLOWED_READERS = {"HOME": {"sysconfig", "site"}}
_PLUMBING = ("os", "posixpath", "genericpath", "ntpath", "_collections_abc", "collections", "importlib", "__main__")


def _record_reads(late):
    """Swap os.environ for a copy that records reads of `late` keys; returns (restore, reads)."""
    base, reads = type(os.environ), {}

    def note(key):
        if key in late:
            f = sys._getframe(2)
            while f is not None and f.f_globals.get("__name__", "").split(".")[0] in _PLUMBING:
                f = f.f_back
            reads.setdefault(key, set()).add(f.f_globals.get("__name__", "?") if f is not None else "?")

    class Recording(base):
        def __getitem__(self, key):
            note(key)
            return base.__getitem__(self, key)

        def __contains__(self, key):
            note(key)
            return base.__contains__(self, key)

    original = os.environ
    rec = object.__new__(Recording)
    rec.__dict__.update(original.__dict__)
    os.environ = rec

    def restore():
        os.environ = original
    return restore, reads


def _missing(e, name):
    """Whether the ModuleNotFoundError `e` says that `name` (or a package it is in) is not installed."""
    return e.name is not None and (name + ".").startswith(e.name + ".")


def _prepare(spec, skipped):
    late = set(spec["late"])
    restore, reads = _record_reads(late)
    try:
        for name in [*spec["preload"], *spec.get("optional", [])]:
            try:
                __import__(name)
            except ModuleNotFoundError as e:
                if name not in spec["preload"] and _missing(e, name):
                    skipped.append(name)  # not in this venv: the harness never imports it either
                    continue
                raise
        name = "complete_models"
        _complete_models(set(spec.get("complete_models", ())))
    except BaseException as e:  # noqa: BLE001 - any import failure means: launch plainly
        return f"preload {name!r} failed: {type(e).__name__}: {e}"
    finally:
        restore()
    bad = sorted(f"{k} read by {m}" for k, mods in reads.items() for m in mods - ALLOWED_READERS.get(k, set()))
    if bad:
        return "late keys read at import: " + ", ".join(bad)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
    if threads != 1 or threading.active_count() != 1:
        return f"the preload started threads ({threads}): forking would be unsafe"
    return None


def _complete_models(packages):
    """Build now the schemas that pydantic models of `packages` (top-level names) deferred to
    their first use (`defer_build`), so that no child builds them again. Each is rebuilt with
    its own module's and defining scope's names only (`_types_namespace={}`, not the frame of
    whoever happened to use it first); one that does not resolve yet stays deferred, as before.
    Returns how many were built."""
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    if not packages or not isinstance(base, type):
        return 0
    seen, todo, built = set(), [base], 0
    while todo:
        for cls in type.__subclasses__(todo.pop()):
            if cls in seen:
                continue
            seen.add(cls)
            todo.append(cls)
            if (getattr(cls, "__module__", None) or "").split(".")[0] not in packages \
                    or cls.__dict__.get("__pydantic_complete__") is not False:
                continue
            try:
                built += bool(cls.model_rebuild(raise_errors=False, _types_namespace={}))
            except Exception:  # noqa: BLE001 - this pydantic's rebuild differs: it builds lazily, as before
                pass
    return built


def _recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise ConnectionError("short request")
        buf += got
    return buf


def _serve(spec, zygote_pp, skipped):
    """The server loop; returns (request, fds, zygote_pp) in a forked child, never in the server."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(spec["socket"])
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "owner")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    live = {}  # pid -> conn
    relays = {}  # listen address -> relay pid
    print(json.dumps({"ok": True, "pid": os.getpid(), "skipped": skipped}), flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "owner":
                if os.read(sys.stdin.fileno(), 4096):
                    continue
                for pid in live:
                    _quiet(os.killpg, pid, signal.SIGKILL)  # each child leads its group (see the fork)
                os._exit(0)
            if key.data == "child":
                os.read(wake_r, 4096)  # the wake-up bytes; select fires again if more are left
                _reap(live)
                continue
            conn, _ = listener.accept()
            fds = []
            try:
                conn.settimeout(10)
                msg, fds, _, _ = socket.recv_fds(conn, 8, 3)
                if len(msg) != 8 or len(fds) != 3:
                    raise ConnectionError("want an 8-byte length and three fds")
                request = json.loads(_recv_exact(conn, struct.unpack("!Q", msg)[0]))
            except (OSError, ValueError) as e:
                _quiet(conn.sendall, (json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n").encode())
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            if request.get("relay"):
                error = _ensure_relay(relays, *request["relay"])
                if error:
                    _quiet(conn.sendall, (json.dumps({"error": error}) + "\n").encode())
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                # lead a group before the launcher learns the pid, so a kill of the group
                # (the owner gone, a timeout) can never miss a child that has not got there yet
                os.setsid()
                os.close(ready_r)
                os.close(ready_w)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for c in [listener, conn, *live.values()]:
                    c.close()
                sel.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, fds, zygote_pp
            os.close(ready_w)
            os.read(ready_r, 1)  # EOF once the child has its own group (or has died)
            os.close(ready_r)
            for fd in fds:
                os.close(fd)
            # a launcher gone already still gets its child reaped; its broken pipe must not end the server
            _quiet(conn.sendall, (json.dumps({"pid": pid}) + "\n").encode())
            live[pid] = conn


def _ensure_relay(relays, listen, target):
    """A relay process listening on `listen` (bound before this returns), forwarding to
    `target`; started once per address, again if it died. Returns an error text or None."""
    pid = relays.get(listen)
    if pid is not None:
        try:
            os.kill(pid, 0)
            return None
        except OSError:  # reaped already: start another
            pass
    import importlib.util
    import ctypes
    try:
        spec = importlib.util.spec_from_file_location("_harnessrl_relay", os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "relay.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        relay = mod.Relay(listen, target)
    except (OSError, ValueError) as e:
        return f"relay {listen} -> {target}: {type(e).__name__}: {e}"
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the server
        if os.getppid() != server:
            os._exit(0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        relay.serve_forever()
        os._exit(0)
    relay.server.close()
    relays[listen] = pid
    return None


def _reap(live):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = live.pop(pid, None)
        if conn is not None:
            _quiet(conn.sendall, (json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())
            conn.close()


def _quiet(fn, *args):
    try:
        fn(*args)
    except OSError:
        pass


def _become(request, fds, zygote_pp):
    """In the child (already leading its own session): be what `python argv[0]` with this
    env in this cwd would be."""
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    # The CPU priority a plain launch gets from the launcher (harnessrl's sandboxes.limits.yield_cpu):
    # the nice value, and this new session's scheduler group's. Best effort, as there.
    if "nice" in request:
        _quiet(os.setpriority, os.PRIO_PROCESS, 0, int(request["nice"]))
    if request.get("group_nice"):
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(int(request["group_nice"])))
        except OSError:
            pass
    env, argv = request["env"], request["argv"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    import site
    import sysconfig
    import tempfile
    site.USER_BASE = site.USER_SITE = None  # recomputed from the child's HOME when asked for
    if hasattr(sysconfig, "_CONFIG_VARS"):
        sysconfig._CONFIG_VARS = None
    tempfile.tempdir = None
    own_pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = sys.path[1 + len(zygote_pp):]
    sys.path[:] = [os.path.dirname(os.path.realpath(argv[0])), *own_pp, *rest]
    sys.argv = list(argv)


def main():
    spec = json.loads(sys.argv[1])
    zygote_pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    skipped = []
    refusal = _prepare(spec, skipped)
    if refusal:
        print(json.dumps({"ok": False, "reason": refusal}), flush=True)
        return None
    gc.collect()
    gc.freeze()  # children share the preloaded heap instead of copying it page by page on gc
    return _serve(spec, zygote_pp, skipped)


def _run_as_main(path):
    """Run the script as `__main__` and end as the interpreter would (Py_RunMain): an uncaught
    exception's traceback (from the script's frames on) and status 1, `SystemExit`'s status or
    message, then non-daemon threads joined, atexit handlers run, buffered files and stdio
    flushed (status 120 if stdio cannot be), KeyboardInterrupt re-raised as SIGINT; then
    `os._exit`, skipping the teardown of the heap shared with the server."""
    import runpy
    code, sigint = 0, False
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        _quiet_call(sys.stdout.flush)  # python flushes stdio before it prints a message (flush_io)
        code = _exit_status(e.code)
    except BaseException as e:  # noqa: BLE001 - printed and turned into the status, as python does
        _quiet_call(sys.stdout.flush)  # ... and before the traceback: one pipe keeps python's order
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        if tb is not None:  # python's own hook prints the exception's traceback, whatever it is passed
            e.__traceback__ = tb
        _quiet_call(sys.excepthook, type(e), e, e.__traceback__)
        code, sigint = 1, isinstance(e, KeyboardInterrupt)
    import threading
    _quiet_call(getattr(threading, "_shutdown", lambda: None))
    import atexit
    atexit._run_exitfuncs()
    code = _flush_all(code)
    if sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_status(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    _quiet_call(lambda: (print(value, file=sys.stderr), sys.stderr.flush()))
    return 1


def _flush_all(code):
    """Flush what the interpreter's teardown would have: buffered files still open (their
    objects were made after the fork, so `gc.get_objects` holds them: the frozen heap is
    apart), then stdout and stderr."""
    import io
    buffered = (io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair, io.TextIOWrapper)
    std = {id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)}
    for obj in gc.get_objects():
        if isinstance(obj, buffered) and id(obj) not in std:
            _quiet_call(lambda: obj.closed or obj.flush())
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:  # noqa: BLE001 - as python: a failed flush of stdio at exit is status 120
            code = 120
    for stream in (sys.__stdout__, sys.__stderr__):  # replaced ones: their teardown flushed them
        if stream is not None and stream not in (sys.stdout, sys.stderr):
            _quiet_call(lambda: stream.closed or stream.flush())
    return code


def _quiet_call(fn, *args):
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass


if __name__ == "__main__":
    job = main()
    if job is None:
        sys.exit(0)
    _become(*job)
    del job
    _run_as_main(sys.argv[0])
