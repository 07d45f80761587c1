"""Run a beside harness as a host process: wall-clock limit, whole process group killed on
timeout (harnesses spawn children), stdin closed (several harnesses read it when not a TTY)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass
class HostRun:
    exit_code: int | None
    """None when it was killed for the time limit."""
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


def run_host(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> HostRun:
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return HostRun(None if timed_out else proc.returncode, out.decode("utf-8", "replace"),
                   err.decode("utf-8", "replace"), timed_out, time.monotonic() - t0)


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """A minimal host environment: no inherited API keys or proxies reach the harness."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "SSL_CERT_FILE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env.update(extra)
    return env
