"""Extra read-only host paths a harness config mounts into its sandbox (the `mounts` key).

Each entry is "HOST" (mounted at the same path) or "HOST:TARGET". Both must be absolute; the
host path must exist and is resolved (symlinks followed) before it is judged, so a link to a
refused place is refused too. Refused: the host root, system and credential places (/etc,
/proc, /sys, /dev, /boot, /run, /var/run, /var/lib/docker, ~/.ssh, ~/.docker, ~/.aws, ~/.gnupg,
~/.config/gcloud, ~/.kube, /root or /home whole) and anything under them, any socket (e.g.
docker.sock), and targets over the sandbox's own mounts or system dirs. A mount is always
read-only: a policy's commands can read it and never change the host.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from harnessrl.adapters.base import SANDBOX_SCRATCH, SOCKET_MOUNT, TOOLCHAIN_MOUNT, Mount

#: Host places never mounted, nor anything beneath them.
REFUSED_TREES = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/var/lib/docker")
#: Under any home: credentials.
REFUSED_IN_HOME = (".ssh", ".docker", ".aws", ".gnupg", ".kube", ".config/gcloud")
#: Host places refused themselves (what is below them may be mounted).
REFUSED_EXACT = ("/", "/root", "/home", "/var", "/usr", "/opt", "/tmp")
#: Sandbox targets that are refused themselves, and trees no mount may land in.
RESERVED_TARGETS = ("/", "/tmp", "/opt", "/home", "/root", "/var", "/run")
RESERVED_TARGET_TREES = ("/opt/harnessrl", TOOLCHAIN_MOUNT, SOCKET_MOUNT, SANDBOX_SCRATCH, "/proc", "/sys", "/dev",
                         "/etc", "/usr",
                         "/bin", "/sbin", "/lib", "/lib64", "/boot")


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _homes() -> list[str]:
    homes = {os.path.realpath(os.path.expanduser("~")), "/root"}
    if os.path.isdir("/home"):
        homes |= {os.path.join("/home", d) for d in os.listdir("/home")}
    return sorted(homes)


def refusal(host: str) -> str | None:
    """Why a (resolved) host path may not be mounted; None when it may."""
    if host in REFUSED_EXACT:
        return f"{host} is refused whole (mount a folder below it)"
    for tree in REFUSED_TREES:
        if _within(host, tree):
            return f"{host} is under {tree} (system and runtime files are never mounted)"
    for home in _homes():
        for secret in REFUSED_IN_HOME:
            if _within(host, f"{home}/{secret}"):
                return f"{host} holds credentials ({home}/{secret})"
    if stat.S_ISSOCK(os.stat(host).st_mode):
        return f"{host} is a socket (a docker or agent socket would hand the sandbox the host)"
    return None


def parse_mount(entry: str, field: str = "mounts") -> Mount:
    """One `mounts` entry as a read-only Mount; ValueError naming the entry and why."""
    host, sep, target = entry.partition(":")
    target = target if sep else host
    if not host.startswith("/") or not target.startswith("/"):
        raise ValueError(f"{field}: {entry!r}: host and target paths must be absolute")
    if not os.path.exists(host):
        raise ValueError(f"{field}: {entry!r}: {host} does not exist on this host")
    real = os.path.realpath(host)
    why = refusal(real)
    if why is not None:
        raise ValueError(f"{field}: {entry!r}: refused: {why}")
    target = os.path.normpath(target)
    if target in RESERVED_TARGETS or any(_within(target, t) for t in RESERVED_TARGET_TREES):
        raise ValueError(f"{field}: {entry!r}: target {target} is reserved in the sandbox")
    return Mount(str(Path(real)), target, True)


def parse_mounts(entries: list[str], field: str = "mounts") -> list[Mount]:
    mounts = [parse_mount(e, field) for e in entries]
    targets = [m.target for m in mounts]
    dup = sorted({t for t in targets if targets.count(t) > 1})
    if dup:
        raise ValueError(f"{field}: more than one mount at {dup}")
    return mounts
