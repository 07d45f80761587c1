"""Run an inside harness in the episode's sandbox, reaching the proxy through the relay.

One `Sandbox.exec` runs a small bash script: start adapters/relay.py (copied into the
sandbox) on the container's 127.0.0.1:RELAY_PORT forwarding to the bind-mounted
SOCKET_MOUNT/proxy.sock, wait until it listens, run the harness under `timeout` with stdin
closed and stdout/stderr to separate files, stop the relay, exit with the harness's status.
The sandbox needs `inside_mounts(launch)`: the toolchain read-only and the socket directory.
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from harnessrl.adapters.base import (RELAY_PORT, SANDBOX_SCRATCH, SOCKET_MOUNT, SOCKET_NAME, TOOLCHAIN_MOUNT,
                                     Endpoint, Launch, Mount)
from harnessrl.adapters.toolchain import toolchain_root

RELAY_SRC = Path(__file__).with_name("relay.py")
#: Exit status of `timeout` when the harness ran past its wall time.
TIMEOUT_EXIT = 124
#: Exit status the script uses when the relay never came up (infrastructure, not the harness).
RELAY_FAILED_EXIT = 199


@dataclass
class InsideRun:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


def inside_mounts(endpoint: Endpoint, toolchain: Path | None = None) -> list[Mount]:
    if endpoint.socket_dir is None:
        raise ValueError("an inside harness needs Endpoint.socket_dir (the proxy's per-episode unix socket)")
    root = toolchain or toolchain_root()
    return [Mount(str(root), TOOLCHAIN_MOUNT, True), Mount(endpoint.socket_dir, SOCKET_MOUNT, False)]


def path_for(npm_name: str) -> str:
    return f"{TOOLCHAIN_MOUNT}/npm/{npm_name}/bin:{TOOLCHAIN_MOUNT}/node/bin:/usr/local/bin:/usr/bin:/bin"


def run_inside(launch: Launch, argv: list[str], env: dict[str, str], files: dict[str, bytes]) -> InsideRun:
    """Write `files` (absolute sandbox paths), then run argv with env; returns its streams."""
    sb = launch.sandbox
    d = SANDBOX_SCRATCH
    dirs = sorted({d, f"{d}/home"} | {str(Path(p).parent) for p in files})
    sb.exec(shlex.join(["mkdir", "-p", *dirs]), timeout=30)
    sb.write_file(f"{d}/relay.py", RELAY_SRC.read_bytes())
    for path, data in files.items():
        sb.write_file(path, data, 0o600)
    wall = max(1, int(launch.limits.wall_time_s))
    script = f"""
rm -f {d}/relay.ready
python3 {d}/relay.py --listen tcp:127.0.0.1:{RELAY_PORT} --target unix:{SOCKET_MOUNT}/{SOCKET_NAME} \\
  --ready-file {d}/relay.ready 2>{d}/relay.err &
relay=$!
for i in $(seq 600); do [ -e {d}/relay.ready ] && break; sleep 0.05; done  # <= 30 s under load
if [ ! -e {d}/relay.ready ]; then cat {d}/relay.err >&2; kill $relay 2>/dev/null; exit {RELAY_FAILED_EXIT}; fi
timeout -k 5 {wall} {shlex.join(argv)} </dev/null >{d}/stdout 2>{d}/stderr
rc=$?
kill $relay 2>/dev/null
exit $rc
"""
    t0 = time.monotonic()
    res = sb.exec(script, timeout=wall + 30, env=env, workdir=sb.workdir)
    dur = time.monotonic() - t0

    def read(name: str) -> str:
        try:
            return sb.read_file(f"{d}/{name}").decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - a missing stream file only loses the tail
            return ""

    if res.exit_code == RELAY_FAILED_EXIT:
        from harnessrl.sandboxes.base import SandboxError
        raise SandboxError(f"relay to the proxy socket did not start in the sandbox: {res.output[-500:]}")
    timed_out = res.timed_out or res.exit_code == TIMEOUT_EXIT
    return InsideRun(None if timed_out else res.exit_code, read("stdout"), read("stderr") + res.output,
                     timed_out, dur)
