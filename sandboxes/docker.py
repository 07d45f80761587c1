"""Docker sandboxes: one container per episode, from an offline task image, on the real engine.

Contract: a container runs the base image with the repository baked in, or, for a task that
names its own image (`RepoSpec.image`), that image (present locally; nothing is ever pulled)
with the repository baked in the same way; a task with its own Dockerfile context
(`RepoSpec.image_context`, e.g. a Harbor task) has that image built offline first and its
workdir exported as the repository (sandboxes.context_image), and a task's own cpus /
memory / storage (RepoSpec) replace the config's. It has no network (`network_mode=none`), CPU / memory / pids limits, every
capability dropped, `no-new-privileges`, runs as `agent` (uid 1000), and a read-only root;
only the repository (`spec.workdir`), `/tmp`, `/home/agent` (anonymous volumes, seeded from
the image, removed with the container) and a sized `/dev/shm` are writable; every file is capped
by RLIMIT_FSIZE. Reset kills every process but PID 1 and empties /tmp, /dev/shm, /dev/mqueue
and SysV IPC. A command's process group ends with the command (so do its `&` jobs and any fork
bomb); to keep a server running across commands, start it with `setsid -f` and wait in that
command until it is up. Containers carry
`harnessrl.managed=1` and a run id, so `reap()` removes what a crashed run left. Commands and
resets go through PID 1 (sandbox_init.py) over `docker attach`, not `docker exec` (a runc start
each, about 125 ms of the host's CPU); PID 1 keeps pytest imported (`DockerConfig.warm_python`),
and the grader's `python3 -I --check-hash-based-pycs always runner.py` runs in a fork of it
(sandbox_init.py says what such a fork is and is not). Nothing the container prints is
logged by the daemon. Files cross as tar streams (put_archive / get_archive), never on a
command line. If the container is gone, every call
raises SandboxDied; a command past its timeout is killed and reported with exit_code -1.
The containers' cgroups go under one with the CPU weight of a process at the environment's
nice value (`limits.docker_cgroup_parent`), so with every core busy they yield to the engine.

Nothing of the host need be in a sandbox: PID 1 also tunnels (`DockerSandbox.tunnel`,
sandboxes/tunnel.py), so a harness inside reaches the proxy over the attach stream and the
proxy's socket dir (a `socket` mount) is never mounted; on an engine other than this machine's
default (`DockerConfig.engine`: unix, tcp with TLS, ssh) read-only folders are copied to the
engine once instead of bound, the base image is loaded there from the local engine, and the
cgroup parent is skipped with its reason in `cgroup_note` (sandboxes/engine.py). The config is
sandboxes/docker_config.py; one sandbox is sandboxes/docker_sandbox.py.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from harnessrl.sandboxes.base import RepoSpec, SandboxUnavailable
from harnessrl.sandboxes.context_image import build_context_image, export_workdir
from harnessrl.sandboxes.docker_config import DockerConfig
from harnessrl.sandboxes.docker_sandbox import HOME, WARM_PYTHON_FLAGS, DockerSandbox
from harnessrl.sandboxes.engine import connect, copied_volume, ensure_base_image, is_local, resolve
from harnessrl.sandboxes.images import (HOME_PRISTINE, PRISTINE_DIR, lock_for, base_image_tag, build_base_image,
                                        ensure_task_image)
from harnessrl.sandboxes.limits import docker_cgroup_parent
from harnessrl.sandboxes.repo import RESET_SCRIPT

__all__ = ["DockerConfig", "DockerBackend", "DockerSandbox", "WARM_PYTHON_FLAGS", "base_image_tag", "build_base_image",
           "reap", "MANAGED_LABEL", "RUN_LABEL"]

log = logging.getLogger("harnessrl.sandboxes")

MANAGED_LABEL = "harnessrl.managed"
RUN_LABEL = "harnessrl.run_id"
# PID 1 of every sandbox: reaps orphans, cannot be signalled from inside, runs commands and
# resets for the host over `docker attach` (see sandbox_init.py).
_INIT = Path(__file__).with_name("sandbox_init.py").read_text()
# Before reset: kill every process but PID 1 (left-over servers of the last episode; repeated,
# so a child forked while the first sweep ran dies too), make the agent's scratch writable
# again, empty /tmp, /dev/shm, /dev/mqueue and SysV IPC, and put home back as the image had it
# (so nothing, e.g. applied hidden tests or a copy of them, reaches the next episode, while
# what set-up installed there, e.g. `pip install --user`, stays).
_CLEAN_PROCS_AND_SCRATCH = f"""n=0
while kill -9 -1 2>/dev/null && [ $n -lt 50 ]; do n=$((n + 1)); done
shopt -s nullglob dotglob
chmod -R u+rwX /tmp {HOME} /dev/shm 2>/dev/null || true
scratch=(/tmp/* {HOME}/* /dev/shm/* /dev/mqueue/*)
[ ${{#scratch[@]}} -eq 0 ] || rm -rf "${{scratch[@]}}" 2>/dev/null || true
ipcrm --all 2>/dev/null || true
[ ! -d {HOME_PRISTINE} ] || cp -a {HOME_PRISTINE}/. {HOME}/
shopt -u nullglob dotglob
"""


_RESET = _CLEAN_PROCS_AND_SCRATCH + "\n" + RESET_SCRIPT


def _client(config: DockerConfig | None = None):
    config = config or DockerConfig()
    try:
        client = connect(config.engine, config.cert_path)
        client.ping()
        return client
    except Exception as e:  # no SDK, no socket, engine not answering
        raise SandboxUnavailable(f"no Docker engine answers ({type(e).__name__}: {e}); install "
                                 "docker.io and start dockerd (scripts/setup.sh does both)") from e


def _mount_spec(m: Any):
    """A Mount-like object (host, target, read_only) or a (host, target, read_only) tuple."""
    import docker.types

    host, target, ro = (m.host, m.target, m.read_only) if hasattr(m, "host") else m
    return docker.types.Mount(target, host, type="bind", read_only=bool(ro))


class DockerBackend:
    """Creates docker sandboxes for RepoSpecs; builds and caches their images."""

    name = "docker"

    def __init__(self, config: DockerConfig | None = None):
        self.config = config or DockerConfig()
        self.client = _client(self.config)
        self.run_id = self.config.run_id or uuid.uuid4().hex[:12]
        info = self.client.info()
        self.local = is_local(self.config.engine)
        """The engine is this machine's default one: its host paths and cgroups are ours."""
        self.host_mounts = self.local if self.config.host_mounts is None else self.config.host_mounts
        self.ncpu = int(info.get("NCPU") or os.cpu_count() or 1)
        # where the containers' cgroups go: under one that yields the CPU to the engine, or Docker's default (None)
        if self.local:
            self.cgroup_parent, why = docker_cgroup_parent(str(info.get("CgroupDriver", "")),
                                                           str(info.get("CgroupVersion", "1")))
        else:
            self.cgroup_parent, why = None, (f"engine {resolve(self.config.engine)} is not this machine's default: "
                                             "its host's cgroupfs is out of reach from here, so containers keep "
                                             "the engine's default cgroup (CPU, memory and pids caps still apply)")
        self.cgroup_note = why
        """Where the containers' cgroups go and why (recorded: a remote engine's are skipped)."""
        log.info("docker sandboxes: %s", why)

    def image_for(self, spec: RepoSpec) -> str:
        """The sandbox image of `spec`: built on the task's own image (`spec.image`) when it
        names one, which must be present locally (never pulled), else on the base image."""
        if spec.image is None:
            base = self.config.base_image or base_image_tag()
            if not self.local:
                ensure_base_image(self.client, base)
            return ensure_task_image(self.client, spec, base)
        import docker.errors

        if spec.image_context:  # the task's own Dockerfile: built offline, its workdir the source
            base = self.config.base_image or base_image_tag()
            if not self.local:
                ensure_base_image(self.client, base)
            with lock_for(spec.image):
                build_context_image(self.client, spec, base)
                export_workdir(self.client, spec)

        try:
            own = self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"task image {spec.image!r} of {spec.repo_id!r} is not present locally and is never pulled; "
                f"fix: `docker load` or build it under that tag on this machine, or drop the task's image_name"
            ) from None
        # FROM the tag, keyed by the image id, so a rebuilt tag gets a new sandbox image.
        return ensure_task_image(self.client, spec, spec.image, key_extra=own.id)

    def create(self, spec: RepoSpec, mounts: Sequence[Any] = (), env: dict[str, str] | None = None,
               start: bool = True) -> "DockerSandbox":
        """A new sandbox for `spec` (started unless start=False). `mounts`: extra bind mounts as
        (host_path, container_path, read_only) tuples or objects with those attributes."""
        import docker.types

        image = self.image_for(spec)
        base_sha = self.client.images.get(image).labels.get("harnessrl.base_sha", "")
        c = self._limits(spec)
        reset_argv = ["bash", "-c", _RESET, "harnessrl", spec.workdir, base_sha, PRISTINE_DIR]
        init = ["python3", "-S", "-c", _INIT, json.dumps(reset_argv)]
        if c.warm_python:
            init = ["python3", *WARM_PYTHON_FLAGS, *init[2:], json.dumps({"warm": list(c.warm_python)})]
        container = self.client.containers.create(
            image, init, stdin_open=True,
            user="1000:1000", working_dir=spec.workdir,
            network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=c.memory, memswap_limit=c.memory, pids_limit=c.pids_limit,
            nano_cpus=int(c.cpus * 1e9), environment={"HOME": HOME, **(env or {})},
            shm_size=c.shm_size, log_config={"type": "none"},  # PID 1's stdout carries command output
            ulimits=[docker.types.Ulimit(name="fsize", soft=c.file_size_limit, hard=c.file_size_limit)]
            if c.file_size_limit else None,
            mounts=[docker.types.Mount(p, None, type="volume") for p in (spec.workdir, "/tmp", HOME)]
            + self._mounts(mounts, image),
            cgroup_parent=self.cgroup_parent,
            labels={MANAGED_LABEL: "1", RUN_LABEL: self.run_id, "harnessrl.repo_id": spec.repo_id,
                    "harnessrl.created": str(int(time.time()))})
        sb = DockerSandbox(container, spec, base_sha, self.config)
        if start:
            sb.start()
        return sb

    def _mounts(self, mounts: Sequence[Any], image: str) -> list:
        """Docker mounts for `mounts`: socket dirs left out (sandboxes tunnel, DockerSandbox.tunnel);
        read-only folders bound, or copied to the engine once (`host_mounts` False)."""
        import docker.types

        out = []
        for m in mounts:
            if getattr(m, "socket", False):
                continue
            if self.host_mounts:
                out.append(_mount_spec(m))
                continue
            host, target, ro = (m.host, m.target, m.read_only) if hasattr(m, "host") else m
            if not ro or not os.path.isdir(host):
                raise SandboxUnavailable(f"mount {host} -> {target}: engine {resolve(self.config.engine)} takes no host "
                                         "bind mounts (DockerConfig.host_mounts false): only read-only folders are "
                                         "copied to it")
            out.append(docker.types.Mount(target, copied_volume(self.client, host, image), type="volume",
                                          read_only=True))
        return out

    def reap(self, older_than_s: float = 0.0, run_id: str | None = None) -> int:
        return reap(self.client, older_than_s, run_id)

    def _limits(self, spec: RepoSpec) -> DockerConfig:
        """The config with a task's own cpus / memory / storage (RepoSpec) in place of ours;
        cpus capped at the engine's cores (it refuses more)."""
        c = self.config
        update: dict[str, Any] = {}
        if spec.cpus:
            update["cpus"] = min(float(spec.cpus), float(self.ncpu))
        if spec.memory_mb:
            update["memory"] = f"{int(spec.memory_mb)}m"
        if spec.storage_mb:
            update["file_size_limit"] = min(c.file_size_limit or 1 << 62, int(spec.storage_mb) << 20)
        return c.model_copy(update=update) if update else c


def reap(client=None, older_than_s: float = 0.0, run_id: str | None = None) -> int:
    """Remove managed containers (and their volumes) older than `older_than_s`, optionally of
    one run only; return how many were removed."""
    import docker.errors

    client = client or _client()
    labels = [f"{MANAGED_LABEL}=1"] + ([f"{RUN_LABEL}={run_id}"] if run_id else [])
    now, removed = time.time(), 0
    for ct in client.containers.list(all=True, filters={"label": labels}):
        created = float(ct.labels.get("harnessrl.created", "0") or 0)
        if now - created < older_than_s:
            continue
        try:
            ct.remove(force=True, v=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed
