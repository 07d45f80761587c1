"""Beside harnesses off the network: each runs in a network namespace of its own whose only
way out is the proxy.

Contract. A beside harness (a host process: adapters/proc.py `run_host`, plain or forked) is
started under `bwrap --unshare-net --cap-drop ALL` (no capabilities, so no `setns` back into
the host's namespace even when run as root): its namespace has a loopback and nothing else, so a TCP
or UDP connection to any host address, DNS included, fails; abstract unix sockets are per
namespace, so the host's are out of reach too; and the host's /run (/var/run: the Docker
socket, D-Bus, nscd, systemd-resolved) is an empty tmpfs. The proxy stays reachable at the very
URL the adapter was handed (http://127.0.0.1:PORT/...): adapters/netns_launch.py listens on
the namespace's 127.0.0.1:PORT and relays each connection to a unix socket in a private host
directory, behind which a host-side `Relay` (adapters/relay.py) forwards to the proxy's
127.0.0.1:PORT. What stays reachable: the filesystem (the harness's venv, its scratch dir, the
exec bridge socket there), so a unix socket bound elsewhere on the host filesystem (outside
/run) is still connectable; see docs/trust.md.

`network = "host"` (an adapter's capability or a command config's key) opts out: the harness
runs in the host's network namespace, as it did before. Either way `HostRun.network` says
which, and the episode records it as `harness_network`. When bwrap or its network namespace is
unavailable on this machine, a proxy-only launch fails with `NetnsUnavailable`, whose message
names the opt-out; it never runs with the network silently.
"""
from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from harnessrl.adapters.relay import Relay

Network = Literal["proxy-only", "host"]
NETWORKS: tuple[str, ...] = ("proxy-only", "host")
LAUNCHER = Path(__file__).with_name("netns_launch.py")
#: Host paths replaced by an empty tmpfs in the namespace (the unix sockets of system daemons).
HIDDEN = ("/run", "/var/run")


class NetnsUnavailable(RuntimeError):
    """A proxy-only launch cannot be isolated on this machine; the message says why and names
    the opt-out."""


_lock = threading.Lock()
DOOR_THREAD = "harnessrl-proxy-door"
"""The name of a door's thread: one per proxy port, kept for the process's life (`door`)."""
_checked: str | None = None
_doors: dict[tuple[str, int], tuple[str, Relay]] = {}


def check() -> None:
    """Raise NetnsUnavailable unless `bwrap --unshare-net` works here (checked once)."""
    global _checked
    with _lock:
        if _checked is None:
            _checked = _probe()
    if _checked:
        raise NetnsUnavailable(f"beside harness cannot be taken off the network: {_checked}; "
                               "set network = \"host\" in the harness config to run it with the host's network")


def _probe() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap (bubblewrap) is not installed"
    try:
        p = subprocess.run([bwrap, "--unshare-net", "--dev-bind", "/", "/", "--", "true"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap --unshare-net failed: {e}"
    return "" if p.returncode == 0 else f"bwrap --unshare-net failed: {p.stderr.strip()[:300] or p.returncode}"


def proxy_port(base_url: str) -> tuple[str, int]:
    """(host, port) of a loopback proxy URL; a proxy elsewhere cannot be relayed (ValueError)."""
    u = urlsplit(base_url)
    if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost") or u.port is None:
        raise ValueError(f"proxy-only network needs the proxy at http://127.0.0.1:PORT, got {base_url!r}")
    return "127.0.0.1", u.port


def door(base_url: str) -> tuple[int, str]:
    """(port, unix socket path) through which a namespace reaches the proxy of `base_url`: one
    host-side relay per proxy port, shared by every launch, closed at exit."""
    host, port = proxy_port(base_url)
    with _lock:
        got = _doors.get((host, port))
        if got is None:
            path = str(Path(tempfile.mkdtemp(prefix="harnessrl-door-")) / "proxy.sock")
            got = _doors[(host, port)] = (path, Relay(f"unix:{path}", f"tcp:{host}:{port}", 0o600).start(DOOR_THREAD))
    return port, got[0]


def relay_spec(base_url: str) -> list[str]:
    """[listen, target]: what a relay inside the namespace listens on (the proxy's own
    127.0.0.1:PORT, so the URL the harness was handed works unchanged) and forwards to."""
    port, sock = door(base_url)
    return [f"tcp:127.0.0.1:{port}", f"unix:{sock}"]


def isolate(argv: list[str]) -> list[str]:
    """argv run in a fresh network namespace (loopback only) with /run hidden; nothing relayed
    yet (the fork server relays per launch: adapters/prefork_server.py)."""
    check()
    hide = [a for d in HIDDEN if not Path(d).is_symlink() and Path(d).is_dir() for a in ("--tmpfs", d)]
    # no capabilities (bounding set too): run as root, it keeps CAP_SYS_ADMIN otherwise and can
    # setns() back into any host process's network namespace
    return [shutil.which("bwrap") or "bwrap", "--unshare-net", "--die-with-parent", "--cap-drop", "ALL",
            "--dev-bind", "/", "/", *hide, "--", *argv]


def wrap(argv: list[str], base_url: str) -> list[str]:
    """argv run in a fresh network namespace whose only way out is the proxy of `base_url`."""
    listen, target = relay_spec(base_url)
    return isolate([sys.executable, str(LAUNCHER), "--listen", listen, "--target", target, "--", *argv])


def _close_all() -> None:
    with _lock:
        doors = list(_doors.values())
        _doors.clear()
    for path, relay in doors:
        relay.close()
        shutil.rmtree(Path(path).parent, ignore_errors=True)


atexit.register(_close_all)
