"""Run a beside harness as a host process: wall-clock limit, stdin closed (several harnesses
read it when not a TTY), and on timeout or cancellation its whole process tree killed: the
process group it leads and every descendant, also those that left the group with `setsid`
(harnesses spawn children, and a policy's commands may daemonize). When it ends on its own,
what it left in its process group is killed. A descendant that both left the session and
was orphaned before the kill is out of reach on the host; commands the harness runs in the
sandbox die with the sandbox."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

import psutil

from harnessrl.adapters import netns
from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.prefork import START_TIMEOUT_S, Prefork, PreforkUnavailable, enabled, interpreter_of, server_for
from harnessrl.sandboxes.limits import yield_cpu


@dataclass
class HostRun:
    exit_code: int | None
    """None when it was killed for the time limit or a cancellation."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    cancelled: bool = False
    """Killed because its episode was cancelled (see `Cancel`)."""
    launch: str = "plain"
    """"forked" (from a warm interpreter, see adapters/prefork.py), "plain", or "plain (why)"
    when a pre-forked launch was asked for and could not be had."""
    network: str = "host"
    """"proxy-only" (its own network namespace, only the proxy reachable: adapters/netns.py)
    or "host" (the host's network)."""


def kill_tree(pid: int, wait_s: float = 10.0) -> list[int]:
    """SIGKILL the process `pid`, its process group and all its descendants; returns the pids
    signalled, after they are gone (dead or zombies) or `wait_s` passed."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:  # stop the tree first, so nothing forks between listing and killing
        _quietly(p.suspend)
    for p in list(procs):  # children forked before the stop
        try:
            procs += [c for c in p.children(recursive=True) if c not in procs]
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        _quietly(p.kill)
    deadline = time.monotonic() + wait_s
    for p in procs:
        while time.monotonic() < deadline and _running(p):
            time.sleep(0.01)
    return [p.pid for p in procs]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _quietly(fn) -> None:
    try:
        fn()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def run_host(argv: list[str], env: dict[str, str], cwd: str, timeout: float, cancel: Cancel | None = None,
             prefork: Prefork | None = None, network: netns.Network = "host",
             proxy_url: str | None = None) -> HostRun:
    """Run argv to its end (or `timeout`, or `cancel`); then whatever it left running in its
    process group is killed too. Its streams go to files, not pipes, so a descendant that
    keeps them open cannot hold the run past its end. `prefork`: argv[0] is a Python console
    script that may start from a warm fork server (adapters/prefork.py); else, or when none
    can serve, a plain process. `network`: "proxy-only" runs it (plain or forked) in a network
    namespace where only the proxy at `proxy_url` is reachable (adapters/netns.py; raises
    `NetnsUnavailable` when this machine cannot), "host" in the host's network. Adapters pass
    their `network` capability (default "proxy-only"); "host" here is for tests of the launch."""
    if network not in netns.NETWORKS:
        raise ValueError(f"network must be one of {netns.NETWORKS}, got {network!r}")
    if network == "proxy-only" and not proxy_url:
        raise ValueError("network \"proxy-only\" needs proxy_url (the proxy the harness may reach)")
    offline = proxy_url if network == "proxy-only" else None
    if offline:
        netns.check()
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc, how = _start(argv, env, cwd, out_f, err_f, prefork, timeout, offline)

        def release() -> None:
            if proc.poll() is None:  # not reaped yet, so its pid is still its own
                kill_tree(proc.pid)

        unregister = cancel.on_set(release) if cancel is not None else (lambda: None)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            timed_out = True
        except BaseException:  # never leave the tree running behind an exception
            kill_tree(proc.pid)
            proc.wait()
            raise
        finally:
            unregister()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind in its group
        except (ProcessLookupError, PermissionError):
            pass
        out, err = _read(out_f), _read(err_f)
    cancelled = cancel is not None and cancel.is_set() and not timed_out
    code = proc.returncode
    if offline and how == "plain" and code is not None and 128 < code <= 128 + 64:
        # bwrap reports a child killed by signal N as its own exit status 128 + N (as a shell
        # does); the record keeps Python's -N, as for a launch without the namespace
        code = -(code - 128)
    return HostRun(None if (timed_out or cancelled) else code, out, err, timed_out,
                   time.monotonic() - t0, cancelled, how, network)


def _start(argv, env, cwd, out_f, err_f, prefork: Prefork | None, timeout: float, offline: str | None):
    if prefork is not None and enabled():
        try:
            server = server_for(interpreter_of(argv[0]), prefork, env, offline is not None)
            return server.spawn(argv, env, cwd, out_f.fileno(), err_f.fileno(), min(timeout, START_TIMEOUT_S),
                                offline), "forked"
        except PreforkUnavailable as e:
            how = f"plain ({e})"
    else:
        how = "plain"
    if offline:
        argv = netns.wrap(argv, offline)
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                            start_new_session=True)
    yield_cpu(proc.pid)  # Popen returns after the exec, so the child leads its session by now
    return proc, how


def _read(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", "replace")


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """A minimal host environment: no inherited API keys or proxies reach the harness."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "SSL_CERT_FILE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env.update(extra)
    return env
