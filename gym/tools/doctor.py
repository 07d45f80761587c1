"""`harnessrl doctor`: is every part this machine needs present? Each missing part names its fix.

Checks are cheap probes (a command, a file, one Docker API call); nothing is installed here.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

from harnessrl.gym.models import DEFAULT_MODEL, MODELS, ModelNotPrepared, resolve_model

SETUP = "scripts/setup.sh"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _docker_client():
    import docker

    client = docker.from_env(timeout=5)
    client.ping()
    return client


def check_docker() -> Check:
    if shutil.which("docker") is None and shutil.which("dockerd") is None:
        return Check("docker engine", False, "docker is not installed", f"apt-get install -y docker.io (or run {SETUP})")
    try:
        version = _docker_client().version().get("Version", "?")
    except Exception as e:  # noqa: BLE001 - any failure means "no engine answers"
        return Check("docker engine", False, f"no engine answers ({type(e).__name__})",
                     "dockerd --bridge=none --iptables=false &  (or run " + SETUP + ")")
    return Check("docker engine", True, f"engine {version} answers")


def check_base_image() -> Check:
    try:
        from harnessrl.sandboxes.docker import base_image_tag
    except ImportError:
        return Check("base image", False, "the docker sandbox backend is not installed", f"run {SETUP}")
    tag = base_image_tag()
    try:
        _docker_client().images.get(tag)
    except Exception as e:  # noqa: BLE001
        return Check("base image", False, f"{tag} missing ({type(e).__name__})", "bash scripts/build_base_image.sh")
    return Check("base image", True, tag)


def check_model(name: str) -> Check:
    try:
        return Check(f"model {name}", True, str(resolve_model(name)))
    except ModelNotPrepared as e:
        return Check(f"model {name}", False, str(e).split(";")[0], f"harnessrl model prepare {name}")


def check_binary(name: str, package: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, False, "not on PATH", f"apt-get install -y {package}")
    try:
        out = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=10)
        version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(name, False, f"{path} does not run ({e})", f"apt-get install --reinstall -y {package}")
    return Check(name, True, f"{path} {version}")


def check_bwrap() -> Check:
    if shutil.which("bwrap") is None:
        return Check("bwrap", False, "not on PATH", "apt-get install -y bubblewrap")
    from harnessrl.sandboxes.bwrap import Identity, probe  # the local backend's own probe: as root
    from harnessrl.sandboxes.local import LocalConfig      # it runs as the unprivileged sandbox uid
    c = LocalConfig()
    problem = probe(Identity(c.sandbox_uid, c.sandbox_gid))
    if problem is not None:
        return Check("bwrap", False, f"cannot run a sandbox: {problem[:200]}",
                     "enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000, "
                     "kernel.unprivileged_userns_clone=1)")
    return Check("bwrap", True, "runs a network-less sandbox as an unprivileged uid")


def check_locations() -> Check:
    """Where models and the harness toolchain live (each movable on its own)."""
    from harnessrl.adapters.toolchain import toolchain_root
    from harnessrl.gym.models import models_root

    models, toolchain = models_root(), toolchain_root()
    return Check("locations", True, f"models {models} ($HARNESSRL_MODELS), toolchain {toolchain} "
                                    "($HARNESSRL_TOOLCHAIN)")


CHECKS: list[Callable[[], Check]] = [
    check_locations,
    check_docker,
    check_base_image,
    lambda: check_model(DEFAULT_MODEL),
    lambda: check_model("tiny-llama"),
    lambda: check_binary("node", "nodejs"),
    lambda: check_binary("npm", "npm"),
    check_bwrap,
]
assert DEFAULT_MODEL in MODELS


def run_checks() -> list[Check]:
    return [check() for check in CHECKS]


def report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{'ok ' if c.ok else 'MISSING'} {c.name:<22} {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"        fix: {c.fix}")
    return "\n".join(lines)
