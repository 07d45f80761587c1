"""Local sandboxes: bubblewrap around a per-sandbox clone on the host, for machines without Docker.

Contract (same Protocol as docker): every command runs in a fresh `bwrap` with all namespaces
unshared (no network at all), all capabilities dropped, uid 1000 inside, read-only binds of
/usr /etc /bin /lib*, and only the sandbox's own repo (at `spec.workdir`), /tmp and
/home/agent writable. Inside processes never hold host root: run as root, harnessrl drops to
`sandbox_uid`/`sandbox_gid` (unprivileged) before bwrap, and a sandbox's files belong to that
uid (see sandboxes/bwrap.py for the launch chain, the allowlisted environment, the fresh
/proc and /dev). Memory and pids limits come from a per-sandbox cgroup when this process may
create one (`limits_enforced` says so); the disk quota from a loop-mounted filesystem of
`disk_quota` bytes when root (`quota_enforced`), and every exec's RLIMIT_FSIZE caps a single
file at that size either way. The spec's setup commands run once per cached checkout (also
inside bwrap, offline). Files travel through the sandbox's stdin/stdout, so symlinks resolve
inside the sandbox, never on the host.

Unlike docker, nothing outlives a command: each exec is its own PID namespace, and its
processes die when it returns (start a server and its client in one command).
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, Field

from harnessrl.sandboxes.base import (ExecResult, RepoSpec, SandboxDied, SandboxError,
                                      SandboxUnavailable)
from harnessrl.sandboxes.bwrap import BASE_ENV, Binds, Identity, isolation, prepare, probe
from harnessrl.sandboxes.hostfs import own, remove
from harnessrl.sandboxes.limits import Cgroup, LoopDisk, sandbox_nice, umount, yield_cpu
from harnessrl.sandboxes.repo import DIFF_SCRIPT, FINALIZE_SCRIPT, RESET_SCRIPT, materialize, spec_key

__all__ = ["LocalConfig", "LocalBackend", "LocalSandbox", "bwrap_works"]

PRISTINE_PARENT = "/opt/harnessrl"
PRISTINE_DIR = f"{PRISTINE_PARENT}/pristine"
HOME = BASE_ENV["HOME"]
log = logging.getLogger(__name__)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class LocalConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """Where local sandboxes live and how they are limited."""

    root: str = "/var/tmp/harnessrl-local"
    """Host directory for cached checkouts (cache/) and live sandboxes (boxes/)."""
    memory: str = "2g"
    """Memory limit per sandbox (cgroup), e.g. 512m."""
    pids_limit: int = 512
    """Most processes per sandbox (cgroup)."""
    require_limits: bool = False
    """Refuse to create sandboxes when no cgroup can enforce memory/pids limits, or (with a
    `disk_quota`) no loop mount can enforce the quota."""
    setup_timeout_s: float = 1800.0
    """Timeout of each setup command when a checkout is first built."""
    output_limit: int = Field(default=4 << 20, gt=0)
    """Most bytes of command output kept per exec."""
    sandbox_uid: int = Field(default=65533, ge=1)
    """Host uid every sandboxed process (and every file of a sandbox and its cached checkout)
    has when harnessrl runs as root; never 0. Default: one of Debian's reserved uids
    (65000-65533), so no user or daemon, not even `nobody`, shares it. Not root: sandboxes
    run as this process's own uid."""
    sandbox_gid: int = Field(default=65533, ge=1)
    """Host gid of sandboxed processes when harnessrl runs as root (no supplementary groups)."""
    disk_quota: str | None = "8g"
    """Most bytes a sandbox's repo, /tmp and home hold together, e.g. 8g (a loop-mounted
    filesystem of that size, root only), and the most any single file may hold (RLIMIT_FSIZE,
    everywhere). None: no quota."""


def _bytes(size: str) -> int:
    s = size.strip().lower().rstrip("b")
    try:
        return int(float(s[:-1]) * _UNITS[s[-1]]) if s and s[-1] in _UNITS else int(s)
    except ValueError:
        raise SandboxError(f"size {size!r} is not a size like 512m or 2g") from None


def bwrap_works(config: "LocalConfig | None" = None) -> bool:
    """Whether bubblewrap can run a sandbox here as it would for real (as the sandbox uid)."""
    c = config or LocalConfig()
    return probe(Identity(c.sandbox_uid, c.sandbox_gid)) is None


def _pump(stream, sink: bytearray, limit: int) -> None:
    while chunk := stream.read(65536):
        if len(sink) < limit:
            sink += chunk[: limit - len(sink)]
    stream.close()


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether `proc` exited within `timeout`; woken by its exit through a pidfd (Popen.wait's
    timeout polls with sleeps up to 50 ms, which would round every command up to them)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:  # poll, not select: a busy process may hold fds past FD_SETSIZE
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(max(0, int(timeout * 1000)))
    finally:
        os.close(pidfd)
    if not ready:
        return False
    proc.wait()
    return True


class LocalBackend:
    """Creates bubblewrap sandboxes; caches one built checkout per RepoSpec."""

    name = "local"

    def __init__(self, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        self.identity = Identity(self.config.sandbox_uid, self.config.sandbox_gid)
        problem = probe(self.identity)
        if problem is not None:
            raise SandboxUnavailable(f"bubblewrap cannot run here: {problem}")
        self.root = Path(self.config.root)
        for sub in ("cache", "boxes", "disks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # Checkouts built for another uid would not be the sandbox's to write.
        self._warned_quota = False
        i = self.identity
        self._cache_flavour = f"local-as-{i.uid}:{i.gid}" if i.drops else "local"

    def checkout(self, spec: RepoSpec) -> Path:
        """The cached, set-up checkout of `spec` (built once, under a file lock)."""
        cdir = self.root / "cache" / spec_key(spec, extra=self._cache_flavour)
        if (cdir / "ready").exists():
            return cdir
        with open(self.root / "cache" / f"{cdir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (cdir / "ready").exists():
                return cdir
            tmp = Path(tempfile.mkdtemp(prefix=f"{cdir.name}.", dir=self.root / "cache"))
            builder = None
            try:
                sha = materialize(spec, tmp / "repo")
                (tmp / "opt").mkdir()
                own(self.identity, tmp, tree=True)  # set-up runs as the sandbox uid
                builder = LocalSandbox(self, spec, tmp, tmp / "opt", sha, pristine_rw=True)
                for cmd in spec.setup_commands:
                    res = builder.exec("set -e; " + cmd, timeout=self.config.setup_timeout_s)
                    if res.exit_code != 0:
                        raise SandboxError(f"setup command {cmd!r} of {spec.repo_id!r} failed "
                                           f"(exit {res.exit_code}): {res.output[-2000:]}")
                builder._script(FINALIZE_SCRIPT, spec.workdir, sha, PRISTINE_DIR)
                (tmp / "base_sha").write_text(sha)
                (tmp / "ready").touch()
                remove(tmp / "tmp")
                os.rename(tmp, cdir)  # keeps home/ as set-up left it: each sandbox starts from it
            finally:
                if builder is not None:
                    builder._binds.remove()
                remove(tmp)
        return cdir

    def reap(self, older_than_s: float = 0.0, run_id: str | None = None) -> int:
        """Remove sandbox dirs (and their cgroups) untouched for `older_than_s`: what a crashed
        run left. `run_id` is accepted for symmetry with docker; local boxes carry none."""
        removed, now = 0, time.time()
        for box in (self.root / "boxes").iterdir():
            if now - box.stat().st_mtime >= older_than_s:
                umount(box)
                remove(box)
                removed += 1
        boxes = {b.name for b in (self.root / "boxes").iterdir()}
        for image in (self.root / "disks").glob("*.img"):
            if image.stem not in boxes:
                image.unlink(missing_ok=True)
        Cgroup.reap(self._cgroup_name(""), keep={self._cgroup_name(b) for b in boxes})
        Binds.reap(self._cgroup_name(""), keep={self._cgroup_name(b) for b in boxes})
        return removed

    def _cgroup_name(self, box: str) -> str:
        """Cgroups are host-wide: the name carries this root's hash, so reap spares other roots."""
        return f"box-{hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:8]}-{box}"

    def create(self, spec: RepoSpec, mounts: Sequence[Any] = (), env: dict[str, str] | None = None,
               start: bool = True) -> "LocalSandbox":
        """A new sandbox for `spec`; `mounts` as (host_path, container_path, read_only) tuples or
        objects with host/target/read_only attributes."""
        if spec.image_context:  # its files and tools come from an image only docker can build
            raise SandboxUnavailable(f"{spec.repo_id!r} is built from its own Dockerfile ({spec.image_context}): "
                                     "it needs the docker backend (--backend docker, sandbox = \"docker\")")
        cdir = self.checkout(spec)
        box = Path(tempfile.mkdtemp(prefix=f"{spec.repo_id[:40]}-", dir=self.root / "boxes"))
        disk = None
        if self.config.disk_quota is not None:
            try:
                disk = LoopDisk.create(self.root / "disks" / f"{box.name}.img", box, _bytes(self.config.disk_quota))
            except OSError as e:
                if self.config.require_limits:
                    remove(box)
                    raise SandboxUnavailable(f"the disk quota cannot be enforced here: {e}") from None
                if not self._warned_quota:
                    log.warning("local sandboxes: disk quota not enforced (only RLIMIT_FSIZE): %s", e)
                    self._warned_quota = True
        try:
            try:  # cp -a keeps the checkout's owner: the sandbox uid that built it
                subprocess.run(["cp", "-a", "--reflink=auto", str(cdir / "repo"), str(cdir / "home"), str(box)],
                               check=True, capture_output=True)
            except subprocess.CalledProcessError as e:
                raise SandboxError(f"cannot copy the checkout of {spec.repo_id!r} into a sandbox: "
                                   f"{e.stderr.decode('utf-8', 'replace')[-500:]}") from None
            sb = LocalSandbox(self, spec, box, cdir / "opt", (cdir / "base_sha").read_text().strip(),
                              mounts=mounts, env=env, home_template=cdir / "home",
                              repo_template=cdir / "repo", disk=disk)
        except BaseException:
            if disk:
                disk.remove()
            remove(box)
            raise
        if start:
            sb.start()
        return sb


class LocalSandbox:
    """One bubblewrap sandbox: a host directory holding repo/, tmp/ and home/."""

    def __init__(self, backend: LocalBackend, spec: RepoSpec, box: Path, opt: Path, base_sha: str,
                 mounts: Sequence[Any] = (), env: dict[str, str] | None = None, pristine_rw: bool = False,
                 home_template: Path | None = None, repo_template: Path | None = None,
                 disk: LoopDisk | None = None):
        self.backend, self.spec, self.box, self.base_sha = backend, spec, box, base_sha
        self.home_template, self.repo_template = home_template, repo_template
        self.workdir = spec.workdir
        self.id = box.name
        self.env = dict(env or {})
        self.disk = disk
        self._closed = False
        self.cgroup: Cgroup | None = None
        # When the repo was last in its base state (made after the copy above): reset restores
        # what set-up left if anything in it changed since. Host memory: the agent cannot move it.
        self._clean_since = time.time()
        for d in (box / "tmp", box / "home"):
            d.mkdir(exist_ok=True)
        own(backend.identity, box, box / "tmp", box / "home")
        binds = [("--bind", str(box / "tmp"), "/tmp"), ("--bind", str(box / "home"), HOME),
                 ("--bind", str(box / "repo"), spec.workdir),
                 ("--bind" if pristine_rw else "--ro-bind", str(opt), PRISTINE_PARENT)]
        for m in mounts:
            host, target, ro = (m.host, m.target, m.read_only) if hasattr(m, "host") else m
            binds.append(("--ro-bind" if ro else "--bind", str(host), str(target)))
        self._binds = Binds(backend.identity, backend._cgroup_name(self.id), binds)

    @property
    def limits_enforced(self) -> bool:
        """Memory and pids limits hold (a cgroup)."""
        return self.cgroup is not None

    @property
    def quota_enforced(self) -> bool:
        """The disk quota holds for repo, /tmp and home together (a loop-mounted filesystem)."""
        return self.disk is not None

    def start(self) -> None:
        c = self.backend.config
        self.cgroup = Cgroup.create(self.backend._cgroup_name(self.id), _bytes(c.memory), c.pids_limit)
        if self.cgroup is None and c.require_limits:
            self.close()
            raise SandboxUnavailable("local sandboxes need a writable cgroupfs to enforce memory/"
                                     "pids limits (run as root, or set require_limits=False)")
        if self.disk is None and c.disk_quota is not None and c.require_limits:
            self.close()
            raise SandboxUnavailable("local sandboxes need root and loop devices to enforce the disk "
                                     "quota (or set disk_quota=None, or require_limits=False)")

    def alive(self) -> bool:
        return not self._closed and (self.box / "repo").is_dir()

    def close(self) -> None:
        self._closed = True
        if self.cgroup:
            self.cgroup.remove()
        if self.disk:
            self.disk.remove()
        self._binds.remove()
        remove(self.box)

    def _bwrap_args(self, env: dict[str, str] | None) -> list[str]:
        """bwrap's options (not its binds): the command's env is exactly BASE_ENV, the sandbox's
        env, the exec's env; nothing of this process's environment."""
        full_env = {**BASE_ENV, **self.env, **(env or {})}
        setenv = [a for k, v in full_env.items() for a in ("--setenv", k, v)]
        return [*isolation(), *setenv]

    def _run(self, argv: list[str], timeout: float, env: dict[str, str] | None = None,
             workdir: str | None = None, stdin: bytes | None = None, merge: bool = True
             ) -> tuple[int, bytes, bytes, bool, float]:
        if not self.alive():
            raise SandboxDied(f"local sandbox {self.id} is closed or its directory is gone")
        c, cg = self.backend.config, self.cgroup
        limit = c.output_limit
        t0 = time.monotonic()
        # The launch shell joins the cgroup while still root, then drops (no preexec_fn: threads).
        launch = prepare(self._bwrap_args(env), self._binds, argv, workdir or self.workdir, dict(BASE_ENV),
                         self.backend.identity, cg.procs_files() if cg else [],
                         fsize=_bytes(c.disk_quota) if c.disk_quota is not None else None)
        try:
            proc = subprocess.Popen(launch.argv, env=launch.env, pass_fds=launch.pass_fds, cwd="/",
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            launch.abandon()
            raise SandboxError(f"cannot launch bubblewrap for local sandbox {self.id}: {e}") from None
        launch.after_spawn()
        # The environment takes the CPU the engine leaves (limits.yield_cpu): the nice value reaches
        # the command; the session bwrap's --new-session starts keeps a group nice of 0 (set from
        # inside, the kernel rate-limits it to one write per 0.1 s machine-wide, so it is not).
        yield_cpu(proc.pid, group=False, nice=sandbox_nice())
        out, err = bytearray(), bytearray()
        readers = [threading.Thread(target=_pump, args=(proc.stdout, out, limit), daemon=True)]
        if not merge:
            readers.append(threading.Thread(target=_pump, args=(proc.stderr, err, limit), daemon=True))
        for r in readers:
            r.start()
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = not _wait(proc, timeout)
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies, and with it its PID namespace
            if cg:
                cg.kill_all()
            proc.wait()
        for r in readers:
            r.join(10)
        started = launch.started()
        if not started and not timed_out:  # the launch chain failed: the command never ran
            tail = (bytes(out) + bytes(err)).decode("utf-8", "replace")[-2000:]
            raise SandboxError(f"local sandbox {self.id} could not start a command "
                               f"(exit {proc.returncode}): {tail}")
        code = -1 if timed_out else proc.returncode
        return code, bytes(out), bytes(err), timed_out, time.monotonic() - t0

    def exec(self, command: str | list[str], timeout: float = 60.0, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        code, out, _, timed_out, dur = self._run(argv, timeout, env, workdir)
        return ExecResult(exit_code=code, output=out.decode("utf-8", "replace"), timed_out=timed_out,
                          duration_s=dur)

    def _script(self, script: str, *args: str, stdin: bytes | None = None, timeout: float = 120.0) -> bytes:
        code, out, err, _, _ = self._run(["bash", "-c", script, "harnessrl", *args], timeout,
                                         workdir="/", stdin=stdin, merge=False)
        if code != 0:
            raise SandboxError(f"sandbox script failed (exit {code}): {err.decode('utf-8', 'replace')[-2000:]}")
        return out

    def diff(self) -> str:
        return self._script(DIFF_SCRIPT, self.workdir, self.base_sha).decode("utf-8", "surrogateescape")

    def reset(self) -> None:
        """Base state again: /tmp and home from the checkout first (freeing a full quota), then
        the repo by RESET_SCRIPT; a repo the script cannot reset (.git deleted, trees chmod-ed
        unreadable, no space left) is replaced by a fresh copy of the cached checkout."""
        for d in (self.box / "tmp", self.box / "home"):
            remove(d)
        self._copy_or_mkdir(self.home_template, self.box / "home")
        self._copy_or_mkdir(None, self.box / "tmp")
        try:
            self._script(RESET_SCRIPT, self.workdir, self.base_sha, PRISTINE_DIR, f"{self._clean_since:.6f}")
        except SandboxDied:
            raise
        except SandboxError:
            if self.repo_template is None:
                raise
            remove(self.box / "repo")
            self._copy_or_mkdir(self.repo_template, self.box / "repo")
        self._clean_since = time.time()

    def _copy_or_mkdir(self, template: Path | None, dest: Path) -> None:
        if template is not None:  # cp -a: owned as set-up left it (by the sandbox uid)
            try:
                subprocess.run(["cp", "-a", "--reflink=auto", str(template), str(dest)], check=True,
                               capture_output=True)
            except subprocess.CalledProcessError as e:
                raise SandboxError(f"cannot restore {dest.name} of local sandbox {self.id}: "
                                   f"{e.stderr.decode('utf-8', 'replace')[-500:]}") from None
        else:
            dest.mkdir()
            own(self.backend.identity, dest)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir}/{path}"

    def read_file(self, path: str) -> bytes:
        p = self._abs(path)
        code, out, err, _, _ = self._run(["bash", "-c", '[ -f "$1" ] || exit 44; exec cat -- "$1"',
                                          "harnessrl", p], 120, workdir="/", merge=False)
        if code == 44:
            raise FileNotFoundError(f"{p} is not a file in local sandbox {self.id}")
        if code != 0:
            raise SandboxError(f"cannot read {p}: {err.decode('utf-8', 'replace')[-500:]}")
        return out

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._script('mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"',
                     self._abs(path), format(mode, "o"), stdin=data)

    def __repr__(self) -> str:
        return f"LocalSandbox({self.id}, {self.spec.repo_id}@{self.base_sha[:8]})"
