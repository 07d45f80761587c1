"""Run an inside harness in the episode's sandbox, reaching the proxy through a tunnel or the relay.

A sandbox that tunnels (`sandboxes.base.Tunnels`, Docker's) is asked to listen on its own
127.0.0.1:RELAY_PORT and carry each connection over its control stream to the episode's
proxy socket on the host (`Endpoint.socket_dir`/proxy.sock): nothing of the host is mounted
for it. Otherwise one `Sandbox.exec` starts adapters/relay.py (copied into the sandbox) on
that port, forwarding to the bind-mounted SOCKET_MOUNT/proxy.sock, and waits until it listens.
Either way the harness then runs under `timeout` with stdin closed and stdout/stderr to
separate files, and the script exits with its status. The sandbox needs
`inside_mounts(endpoint, toolchain, parts)`: the toolchain (or the parts of it the harness
uses) read-only and the socket directory (a `socket` mount, left out where it tunnels).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from harnessrl.adapters.base import (RELAY_PORT, SANDBOX_SCRATCH, SOCKET_MOUNT, SOCKET_NAME, TOOLCHAIN_MOUNT,
                                     Endpoint, Launch, Mount)
from harnessrl.adapters.toolchain import toolchain_root
from harnessrl.sandboxes.base import Sandbox, SandboxError, Tunnels

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


def inside_mounts(endpoint: Endpoint, toolchain: Path | None = None, parts: Sequence[str] = ()) -> list[Mount]:
    """The toolchain read-only at TOOLCHAIN_MOUNT (only `parts`, folders relative to its root,
    e.g. ("node", "npm/codex"), when given: a backend that copies read-only mounts to a remote
    engine copies just those) and the proxy's socket dir."""
    if endpoint.socket_dir is None:
        raise ValueError("an inside harness needs Endpoint.socket_dir (the proxy's per-episode unix socket)")
    root = toolchain or toolchain_root()
    tools = [Mount(str(root / p), f"{TOOLCHAIN_MOUNT}/{p}", True) for p in parts if (root / p).is_dir()] \
        if parts else [Mount(str(root), TOOLCHAIN_MOUNT, True)]
    return [*tools, Mount(endpoint.socket_dir, SOCKET_MOUNT, False, socket=True)]


def npm_parts(npm_name: str) -> tuple[str, ...]:
    """The toolchain folders an npm harness runs from: node and its own prefix."""
    return ("node", f"npm/{npm_name}")


def path_for(npm_name: str) -> str:
    return f"{TOOLCHAIN_MOUNT}/npm/{npm_name}/bin:{TOOLCHAIN_MOUNT}/node/bin:/usr/local/bin:/usr/bin:/bin"


def run_inside(launch: Launch, argv: list[str], env: dict[str, str], files: dict[str, bytes]) -> InsideRun:
    """Write `files` (absolute sandbox paths), then run argv with env; returns its streams."""
    sb = launch.sandbox
    d = SANDBOX_SCRATCH
    dirs = sorted({d, f"{d}/home"} | {str(Path(p).parent) for p in files})
    sb.exec(shlex.join(["mkdir", "-p", *dirs]), timeout=30)
    for path, data in files.items():
        sb.write_file(path, data, 0o600)
    wall = max(1, int(launch.limits.wall_time_s))
    harness = f"timeout -k 5 {wall} {shlex.join(argv)} </dev/null >{d}/stdout 2>{d}/stderr"
    if isinstance(sb, Tunnels) and launch.endpoint.socket_dir:
        with sb.tunnel(f"tcp:127.0.0.1:{RELAY_PORT}", f"unix:{launch.endpoint.socket_dir}/{SOCKET_NAME}"):
            return _finish(sb, harness, env, wall)
    sb.write_file(f"{d}/relay.py", RELAY_SRC.read_bytes())
    script = f"""
rm -f {d}/relay.ready
python3 {d}/relay.py --listen tcp:127.0.0.1:{RELAY_PORT} --target unix:{SOCKET_MOUNT}/{SOCKET_NAME} \\
  --ready-file {d}/relay.ready 2>{d}/relay.err &
relay=$!
for i in $(seq 600); do [ -e {d}/relay.ready ] && break; sleep 0.05; done  # <= 30 s under load
if [ ! -e {d}/relay.ready ]; then cat {d}/relay.err >&2; kill $relay 2>/dev/null; exit {RELAY_FAILED_EXIT}; fi
{harness}
rc=$?
kill $relay 2>/dev/null
exit $rc
"""
    return _finish(sb, script, env, wall)


def _finish(sb: Sandbox, script: str, env: dict[str, str], wall: int) -> InsideRun:
    """Run the launch script; read the harness's streams back."""
    d = SANDBOX_SCRATCH
    t0 = time.monotonic()
    res = sb.exec(script, timeout=wall + 30, env=env, workdir=sb.workdir)
    dur = time.monotonic() - t0

    def read(name: str) -> str:
        try:
            return sb.read_file(f"{d}/{name}").decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - a missing stream file only loses the tail
            return ""

    if res.exit_code == RELAY_FAILED_EXIT:
        raise SandboxError(f"relay to the proxy socket did not start in the sandbox: {res.output[-500:]}")
    timed_out = res.timed_out or res.exit_code == TIMEOUT_EXIT
    return InsideRun(None if timed_out else res.exit_code, read("stdout"), read("stderr") + res.output,
                     timed_out, dur)
