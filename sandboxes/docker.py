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
"""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import queue
import tarfile
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from pydantic import BaseModel, Field

from harnessrl.sandboxes.attach import Channel
from harnessrl.sandboxes.base import (ExecResult, RepoSpec, SandboxDied, SandboxError,
                                      SandboxUnavailable)
from harnessrl.sandboxes.engine import connect, copied_volume, ensure_base_image, is_local, resolve
from harnessrl.sandboxes.context_image import build_context_image, export_workdir
from harnessrl.sandboxes.images import (HOME_PRISTINE, PRISTINE_DIR, lock_for, base_image_tag, build_base_image,
                                        ensure_task_image)
from harnessrl.sandboxes.limits import docker_cgroup_parent
from harnessrl.sandboxes.repo import DIFF_SCRIPT, RESET_SCRIPT
from harnessrl.sandboxes.tunnel import Tunnel

__all__ = ["DockerConfig", "DockerBackend", "DockerSandbox", "base_image_tag", "build_base_image",
           "reap", "MANAGED_LABEL", "RUN_LABEL"]

log = logging.getLogger("harnessrl.sandboxes")

MANAGED_LABEL = "harnessrl.managed"
RUN_LABEL = "harnessrl.run_id"
HOME = "/home/agent"
# PID 1 of every sandbox: reaps orphans, cannot be signalled from inside, runs commands and
# resets for the host over `docker attach` (see sandbox_init.py).
_INIT = Path(__file__).with_name("sandbox_init.py").read_text()
#: PID 1's interpreter flags when it keeps a warm python (DockerConfig.warm_python), and so
#: the flags of a python that may fork from it: the grader's runner's (gym/grading/hidden_tests.py).
WARM_PYTHON_FLAGS = ("-I", "--check-hash-based-pycs", "always")
# Every exec: `timeout` puts the command in its own process group; the group dies with it.
# $1=1 merges stderr into stdout at the source, so their order is kept (PID 1 reads the two apart).
_WRAP = """[ "$1" = 1 ] && exec 2>&1
t="$2"; shift 2
timeout -k 2 "$t" "$@" &
pid=$!
{ wait "$pid"; } 2>/dev/null; rc=$?
kill -9 -- "-$pid" 2>/dev/null; kill -9 -- "-$pid" 2>/dev/null
exit "$rc"
"""
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


class DockerConfig(BaseModel):
    """How docker sandboxes are limited and labelled."""

    cpus: float = 1.0
    """CPU quota per container (cores)."""
    memory: str = "2g"
    """Memory limit per container (docker syntax, e.g. 512m); swap is not allowed on top."""
    pids_limit: int = 512
    """Most processes/threads in one container (contains fork bombs)."""
    run_id: str | None = None
    """Label for this run's containers (reap(run_id=...)); None: a fresh id per backend."""
    base_image: str | None = None
    """Base image tag; None: base_image_tag() of the packaged recipe."""
    output_limit: int = Field(default=4 << 20, gt=0)
    """Most bytes of command output kept per exec (the rest is dropped and noted)."""
    kill_grace_s: float = 5.0
    """Seconds past an exec's timeout before the host kills it from outside."""
    shm_size: str = "64m"
    """Size of /dev/shm (a tmpfs, emptied on reset)."""
    file_size_limit: int | None = Field(default=1 << 30, gt=0)
    """RLIMIT_FSIZE in bytes for every process (a write past it fails with EFBIG / SIGXFSZ);
    None: unlimited. The repository, /tmp and home volumes have no total quota on this engine
    (overlay2 on ext4 offers none; storage_opt size needs xfs with pquota, and a tmpfs /tmp
    would not take put_archive), so this per-file limit and `shm_size` are what is enforced."""
    diff_limit: int = Field(default=256 << 20, gt=0)
    """Most bytes of the agent's diff read back (past it the diff is cut and noted)."""
    warm_python: tuple[str, ...] = ("pytest", "pluggy", "_pytest.config:default_plugins")
    """Modules PID 1 imports at start, before any command (sandbox_init.py): an exec of
    `python3 -I --check-hash-based-pycs always SCRIPT ...` with no env of its own then runs in
    a fork of it (the grader's hidden-test runner skips ~0.2 s of CPU of pytest's imports an
    episode). Empty: PID 1 runs `python3 -S` and every python is a new interpreter."""
    engine: str | None = None
    """The Docker engine, in DOCKER_HOST form: unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST
    (the `remote` extra); None: $DOCKER_HOST, else this machine's default socket
    (sandboxes/engine.py). Images are built (or the base image loaded) on it, offline."""
    cert_path: str | None = None
    """For a tcp:// engine: a folder with ca.pem, cert.pem and key.pem; TLS is verified against
    it. None: plain TCP (only for an engine on a trusted network)."""
    host_mounts: bool | None = None
    """Whether read-only mounts (a harness's toolchain) are bind-mounted from this host. False:
    each is copied once per engine into a volume and mounted from there, and a writable mount
    is refused (the proxy's socket dir is never mounted: sandboxes tunnel to it). None: bound
    only on this machine's default engine, where host paths are the engine's."""


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
            with lock_for(spec.image):
                build_context_image(self.client, spec, self.config.base_image or base_image_tag())
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


class DockerSandbox:
    """One container holding one repository checkout (see the module docstring)."""

    def __init__(self, container, spec: RepoSpec, base_sha: str, config: DockerConfig):
        self.container, self.spec, self.base_sha, self.config = container, spec, base_sha, config
        self.workdir = spec.workdir
        self.id = container.id
        self._api = container.client.api
        self._ctl: Channel | None = None  # PID 1's attach stream: commands and resets
        self._ctl_lock = threading.Lock()
        self.warm_runs = 0
        """Execs PID 1 ran in a fork of its warm python (DockerConfig.warm_python)."""

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        """Start the container and wait until PID 1 says it is ready (its signal dispositions
        set: before that, a SIGINT from inside could still stop it). One that fails to is
        closed (the container removed, not left behind "Created"), as a local sandbox is."""
        try:
            ctl = self._channel()  # attached before start, so the ready line cannot be missed
            self.container.start()
            ready = ctl.ready.wait(timeout) and not ctl.closed
        except BaseException as e:
            self.close()
            if not isinstance(e, Exception):
                raise
            raise SandboxError(f"container for {self.spec.repo_id!r} failed to start: "
                               f"{type(e).__name__}: {e}") from e
        if not ready:
            why = ctl.closed or f"no ready line in {timeout:.0f} s"
            self.close()
            raise SandboxError(f"container for {self.spec.repo_id!r} started without its init ({why})")

    def alive(self) -> bool:
        try:
            return self._api.inspect_container(self.id)["State"]["Running"]
        except Exception:
            return False

    def close(self) -> None:
        self._close_ctl()
        try:
            self.container.remove(force=True, v=True)
        except Exception:
            pass  # already gone: closing is idempotent

    # -- PID 1's channel -------------------------------------------------------------------
    def _channel(self) -> Channel:
        """The open channel; a new attach if the last one ended while the container runs (an
        attach to a stopped container would wait for its start: a stopped one raises)."""
        with self._ctl_lock:
            if self._ctl is None or self._ctl.closed:
                if self._ctl is not None:
                    self._ctl.close()
                    self._ctl = None
                    if not self.alive():
                        raise ConnectionError("the container is not running")
                sock = self._api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stream": 1})
                raw = getattr(sock, "_sock", sock)
                raw.settimeout(None)
                self._ctl = Channel(raw)
            return self._ctl

    def _close_ctl(self) -> None:
        with self._ctl_lock:
            if self._ctl is not None:
                self._ctl.close()
                self._ctl = None

    def _request(self, msg: dict, what: str) -> tuple[Channel, int, queue.SimpleQueue]:
        try:
            ctl = self._channel()
            return (ctl, *ctl.request(msg))
        except Exception as e:
            if not self.alive():
                raise self._died(f"cannot {what}", e) from e
            raise SandboxError(f"{what} failed in {self.id[:12]}: {type(e).__name__}: {e}") from e

    def tunnel(self, listen: str, target: str) -> Tunnel:
        """Listen on `listen` in the sandbox; carry each connection over PID 1's attach stream
        to `target` on this host (sandboxes/tunnel.py). Close it when done."""
        try:
            return Tunnel(self._channel(), listen, target)
        except ConnectionError as e:
            if not self.alive():
                raise self._died("cannot open a tunnel", e) from e
            raise SandboxError(f"tunnel in {self.id[:12]}: {e}") from e

    # -- commands --------------------------------------------------------------------------
    def _died(self, what: str, err: Exception | None = None) -> SandboxDied:
        return SandboxDied(f"sandbox {self.id[:12]} ({self.spec.repo_id}) is not running; {what}"
                           + (f": {err}" if err else ""))

    def _run(self, argv: list[str], timeout: float, env: dict[str, str] | None,
             workdir: str | None, demux: bool = True, limit: int | None = None
             ) -> tuple[int, bytes, bytes, bool, float]:
        """Run argv through PID 1 (no `docker exec`); return (exit code, stdout, stderr,
        timed_out, seconds). demux=False: stdout and stderr interleaved as they came, all in
        the stdout slot."""
        # In-container `timeout` kills the command's process group at its deadline, and the
        # wrapper kills what is left of the group when the command ends (a fork bomb, stray
        # `&` jobs); the host's deadline below is the backstop for processes that left the group.
        wrapped = ["bash", "-c", _WRAP, "harnessrl-exec", "0" if demux else "1",
                   f"{max(timeout, 0.001):.3f}", *argv]
        limit = limit or self.config.output_limit
        msg = {"op": "exec", "argv": wrapped, "env": env or {}, "cwd": workdir or self.workdir, "limit": limit,
               "merge": not demux}
        if self.config.warm_python and not env and len(argv) > 4 and argv[1:4] == list(WARM_PYTHON_FLAGS) \
                and not argv[4].startswith("-"):  # PID 1 runs it in a fork of its warm interpreter if it can
            msg["warm"] = {"argv": list(argv), "timeout": max(timeout, 0.001)}
        t0 = time.monotonic()
        ctl, rid, q = self._request(msg, "exec")
        out, err = bytearray(), bytearray()
        code, size, forced, ended = None, 0, False, False
        deadline = t0 + timeout + self.config.kill_grace_s
        try:
            while True:
                try:
                    msg = q.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    if forced:
                        break
                    # kill everything but PID 1, then collect what came (5 s more)
                    forced, deadline = True, time.monotonic() + 5.0
                    try:
                        ctl.send({"op": "kill", "id": 0})
                    except OSError:
                        pass
                    continue
                if msg is None:  # the stream ended: the container stopped, or the daemon went
                    ended = True
                    break
                if "o" in msg:
                    out += base64.b64decode(msg["o"])
                elif "e" in msg:
                    err += base64.b64decode(msg["e"])
                elif "rc" in msg:
                    code, size = msg["rc"], msg.get("size", 0)
                    self.warm_runs += bool(msg.get("warm"))
                    break
        finally:
            ctl.done(rid)
        dur = time.monotonic() - t0
        if ended or code is None:
            if not self.alive():
                raise self._died("it stopped while a command ran")
            if ended:
                raise SandboxError(f"exec in {self.id[:12]}: {ctl.closed}")
        if size > limit:
            out += f"\n[harnessrl: output truncated at {limit} bytes]\n".encode()
        timed_out = forced or (code in (124, 137) and dur >= timeout)
        return (-1 if timed_out or code is None else code), bytes(out), bytes(err), timed_out, dur

    def exec(self, command: str | list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        code, out, _, timed_out, dur = self._run(argv, timeout, env, workdir, demux=False)
        text = out.decode("utf-8", "replace")
        return ExecResult(exit_code=code, output=text, timed_out=timed_out, duration_s=dur)

    def _script(self, script: str, *args: str, timeout: float = 120.0, limit: int | None = None) -> bytes:
        code, out, err, timed_out, _ = self._run(["bash", "-c", script, "harnessrl", *args],
                                                 timeout, None, "/", limit=limit)
        if code != 0:
            raise SandboxError(f"sandbox script failed (exit {code}{', timed out' if timed_out else ''}): "
                               f"{err.decode('utf-8', 'replace')[-2000:]}")
        return out

    def diff(self) -> str:
        """Bytes that are not UTF-8 (a latin-1 source file) come back as PEP 383 surrogate
        escapes, so `text.encode("utf-8", "surrogateescape")` is the patch git wrote."""
        return self._script(DIFF_SCRIPT, self.workdir, self.base_sha, PRISTINE_DIR,
                            limit=self.config.diff_limit).decode("utf-8", "surrogateescape")

    def reset(self) -> None:
        """Through PID 1 (no `docker exec`): `kill -9 -1` in the reset script spares PID 1 and
        itself, so every process of the last episode dies."""
        ctl, rid, q = self._request({"op": "reset"}, "reset")
        try:
            reply = q.get(timeout=120.0)
        except queue.Empty:
            reply = None
        finally:
            ctl.done(rid)
        if reply is None:
            why = ctl.closed or "no reply in 120 s"
            if not self.alive():
                raise self._died("cannot reset", ConnectionError(why))
            raise SandboxError(f"reset of {self.id[:12]} failed: {why}")
        if reply.get("rc") != 0:
            raise SandboxError(f"reset of {self.id[:12]} failed (exit {reply.get('rc')}): "
                               f"{reply.get('err', '')[-2000:]}")

    # -- files -----------------------------------------------------------------------------
    def _abs(self, path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(self.workdir) / p

    def read_file(self, path: str) -> bytes:
        import docker.errors

        p = self._abs(path)
        if not self.alive():  # the volumes outlive the container; its sandbox does not
            raise self._died("cannot read")
        try:
            stream, _ = self.container.get_archive(str(p))
        except docker.errors.NotFound as e:
            if not self.alive():
                raise self._died("cannot read", e) from e
            raise FileNotFoundError(f"{p} does not exist in sandbox {self.id[:12]}") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tf:
            member = tf.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{p} is not a regular file in sandbox {self.id[:12]}")
            return tf.extractfile(member).read()

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        import docker.errors

        p = self._abs(path)
        if not self.alive():
            raise self._died("cannot write")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(p.name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, 1000, 1000, time.time()
            tf.addfile(info, io.BytesIO(data))
        for attempt in range(2):
            try:
                self.container.put_archive(str(p.parent), buf.getvalue())
                return
            except docker.errors.NotFound as e:
                if not self.alive():
                    raise self._died("cannot write", e) from e
                if attempt:
                    raise
                self._script('mkdir -p -- "$1"', str(p.parent))
            except docker.errors.APIError as e:
                raise SandboxError(f"cannot write {p}: {e.explanation} (writable: {self.workdir}, "
                                   f"/tmp, {HOME})") from e

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, {self.spec.repo_id}@{self.base_sha[:8]})"

