"""Local sandboxes: bubblewrap around a per-sandbox clone on the host, for machines without Docker.

Contract (same Protocol as docker): every command runs in a fresh `bwrap` with all namespaces
unshared (no network at all), all capabilities dropped, uid 1000 inside, read-only binds of
/usr /etc /bin /lib*, and only the sandbox's own repo (at `spec.workdir`), /tmp and
/home/agent writable. Memory and pids limits come from a per-sandbox cgroup when this process
may create one (`limits_enforced` says so). The spec's setup commands run once per cached
checkout (also inside bwrap, offline). Files travel through the sandbox's stdin/stdout, so
symlinks resolve inside the sandbox, never on the host.

Unlike docker, nothing outlives a command: each exec is its own PID namespace, and its
processes die when it returns (start a server and its client in one command).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
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
from harnessrl.sandboxes.limits import Cgroup
from harnessrl.sandboxes.repo import DIFF_SCRIPT, FINALIZE_SCRIPT, RESET_SCRIPT, materialize, spec_key

__all__ = ["LocalConfig", "LocalBackend", "LocalSandbox", "bwrap_works"]

PRISTINE_PARENT = "/opt/harnessrl"
PRISTINE_DIR = f"{PRISTINE_PARENT}/pristine"
HOME = "/home/agent"
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class LocalConfig(BaseModel):
    """Where local sandboxes live and how they are limited."""

    root: str = "/var/tmp/harnessrl-local"
    """Host directory for cached checkouts (cache/) and live sandboxes (boxes/)."""
    memory: str = "2g"
    """Memory limit per sandbox (cgroup), e.g. 512m."""
    pids_limit: int = 512
    """Most processes per sandbox (cgroup)."""
    require_limits: bool = False
    """Refuse to create sandboxes when no cgroup can enforce memory/pids limits."""
    setup_timeout_s: float = 1800.0
    """Timeout of each setup command when a checkout is first built."""
    output_limit: int = Field(default=4 << 20, gt=0)
    """Most bytes of command output kept per exec."""


def _bytes(size: str) -> int:
    s = size.strip().lower().rstrip("b")
    try:
        return int(float(s[:-1]) * _UNITS[s[-1]]) if s and s[-1] in _UNITS else int(s)
    except ValueError:
        raise SandboxError(f"memory limit {size!r} is not a size like 512m or 2g") from None


def bwrap_works() -> bool:
    """Whether bubblewrap can create the namespaces we need here."""
    if not shutil.which("bwrap"):
        return False
    probe = ["bwrap", "--unshare-all", "--die-with-parent", *_system_binds(), "--proc", "/proc",
             "--dev", "/dev", "--uid", "1000", "--gid", "1000", "--", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _system_binds() -> list[str]:
    args: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def _pump(stream, sink: bytearray, limit: int) -> None:
    while chunk := stream.read(65536):
        if len(sink) < limit:
            sink += chunk[: limit - len(sink)]
    stream.close()


class LocalBackend:
    """Creates bubblewrap sandboxes; caches one built checkout per RepoSpec."""

    name = "local"

    def __init__(self, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        if not bwrap_works():
            raise SandboxUnavailable("bubblewrap cannot run here: install it (apt-get install "
                                     "bubblewrap) and allow user namespaces")
        self.root = Path(self.config.root)
        for sub in ("cache", "boxes"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def checkout(self, spec: RepoSpec) -> Path:
        """The cached, set-up checkout of `spec` (built once, under a file lock)."""
        cdir = self.root / "cache" / spec_key(spec, extra="local")
        if (cdir / "ready").exists():
            return cdir
        with open(self.root / "cache" / f"{cdir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (cdir / "ready").exists():
                return cdir
            tmp = Path(tempfile.mkdtemp(prefix=f"{cdir.name}.", dir=self.root / "cache"))
            try:
                sha = materialize(spec, tmp / "repo")
                (tmp / "opt").mkdir()
                builder = LocalSandbox(self, spec, tmp, tmp / "opt", sha, pristine_rw=True)
                for cmd in spec.setup_commands:
                    res = builder.exec("set -e; " + cmd, timeout=self.config.setup_timeout_s)
                    if res.exit_code != 0:
                        raise SandboxError(f"setup command {cmd!r} of {spec.repo_id!r} failed "
                                           f"(exit {res.exit_code}): {res.output[-2000:]}")
                builder._script(FINALIZE_SCRIPT, spec.workdir, sha, PRISTINE_DIR)
                (tmp / "base_sha").write_text(sha)
                (tmp / "ready").touch()
                shutil.rmtree(tmp / "tmp", ignore_errors=True)
                os.rename(tmp, cdir)  # keeps home/ as set-up left it: each sandbox starts from it
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return cdir

    def reap(self, older_than_s: float = 0.0, run_id: str | None = None) -> int:
        """Remove sandbox dirs (and their cgroups) untouched for `older_than_s`: what a crashed
        run left. `run_id` is accepted for symmetry with docker; local boxes carry none."""
        removed, now = 0, time.time()
        for box in (self.root / "boxes").iterdir():
            if now - box.stat().st_mtime >= older_than_s:
                shutil.rmtree(box, ignore_errors=True)
                removed += 1
        alive = {self._cgroup_name(b.name) for b in (self.root / "boxes").iterdir()}
        Cgroup.reap(self._cgroup_name(""), keep=alive)
        return removed

    def _cgroup_name(self, box: str) -> str:
        """Cgroups are host-wide: the name carries this root's hash, so reap spares other roots."""
        return f"box-{hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:8]}-{box}"

    def create(self, spec: RepoSpec, mounts: Sequence[Any] = (), env: dict[str, str] | None = None,
               start: bool = True) -> "LocalSandbox":
        """A new sandbox for `spec`; `mounts` as (host_path, container_path, read_only) tuples or
        objects with host/target/read_only attributes."""
        cdir = self.checkout(spec)
        box = Path(tempfile.mkdtemp(prefix=f"{spec.repo_id[:40]}-", dir=self.root / "boxes"))
        subprocess.run(["cp", "-a", "--reflink=auto", str(cdir / "repo"), str(cdir / "home"), str(box)],
                       check=True)
        sb = LocalSandbox(self, spec, box, cdir / "opt", (cdir / "base_sha").read_text().strip(),
                          mounts=mounts, env=env, home_template=cdir / "home")
        if start:
            sb.start()
        return sb


class LocalSandbox:
    """One bubblewrap sandbox: a host directory holding repo/, tmp/ and home/."""

    def __init__(self, backend: LocalBackend, spec: RepoSpec, box: Path, opt: Path, base_sha: str,
                 mounts: Sequence[Any] = (), env: dict[str, str] | None = None, pristine_rw: bool = False,
                 home_template: Path | None = None):
        self.backend, self.spec, self.box, self.base_sha = backend, spec, box, base_sha
        self.home_template = home_template
        self.workdir = spec.workdir
        self.id = box.name
        self.env = dict(env or {})
        self._closed = False
        self.cgroup: Cgroup | None = None
        (box / "tmp").mkdir(exist_ok=True)
        (box / "home").mkdir(exist_ok=True)
        self._binds = [*_system_binds(), "--proc", "/proc", "--dev", "/dev",
                       "--bind", str(box / "tmp"), "/tmp", "--bind", str(box / "home"), HOME,
                       "--bind", str(box / "repo"), spec.workdir,
                       "--bind" if pristine_rw else "--ro-bind", str(opt), PRISTINE_PARENT]
        for m in mounts:
            host, target, ro = (m.host, m.target, m.read_only) if hasattr(m, "host") else m
            self._binds += ["--ro-bind" if ro else "--bind", str(host), str(target)]

    @property
    def limits_enforced(self) -> bool:
        return self.cgroup is not None

    def start(self) -> None:
        c = self.backend.config
        self.cgroup = Cgroup.create(self.backend._cgroup_name(self.id), _bytes(c.memory), c.pids_limit)
        if self.cgroup is None and c.require_limits:
            self.close()
            raise SandboxUnavailable("local sandboxes need a writable cgroupfs to enforce memory/"
                                     "pids limits (run as root, or set require_limits=False)")

    def alive(self) -> bool:
        return not self._closed and (self.box / "repo").is_dir()

    def close(self) -> None:
        self._closed = True
        if self.cgroup:
            self.cgroup.remove()
        shutil.rmtree(self.box, ignore_errors=True)

    def _argv(self, argv: list[str], env: dict[str, str] | None, workdir: str | None) -> list[str]:
        full_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME": HOME, "USER": "agent", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                    **self.env, **(env or {})}
        setenv = [a for k, v in full_env.items() for a in ("--setenv", k, v)]
        return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--uid", "1000", "--gid", "1000", "--hostname", "sandbox", *self._binds,
                "--chdir", workdir or self.workdir, "--clearenv", *setenv, "--", *argv]

    def _run(self, argv: list[str], timeout: float, env: dict[str, str] | None = None,
             workdir: str | None = None, stdin: bytes | None = None, merge: bool = True
             ) -> tuple[int, bytes, bytes, bool, float]:
        if not self.alive():
            raise SandboxDied(f"local sandbox {self.id} is closed or its directory is gone")
        limit, cg = self.backend.config.output_limit, self.cgroup
        t0 = time.monotonic()
        full = self._argv(argv, env, workdir)
        if cg:  # a shell joins the cgroup, then becomes bwrap (no preexec_fn: we have threads)
            full = ["sh", "-c", 'for f in $0; do echo $$ > "$f" || exit 125; done; exec "$@"',
                    " ".join(cg.procs_files()), *full]
        proc = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                start_new_session=True)
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
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies, and with it its PID namespace
            if cg:
                cg.kill_all()
            proc.wait()
        for r in readers:
            r.join(10)
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
        return self._script(DIFF_SCRIPT, self.workdir, self.base_sha).decode("utf-8", "replace")

    def reset(self) -> None:
        self._script(RESET_SCRIPT, self.workdir, self.base_sha, PRISTINE_DIR)
        for d in (self.box / "tmp", self.box / "home"):  # rmtree never follows symlinks
            shutil.rmtree(d, ignore_errors=True)
        (self.box / "tmp").mkdir()
        if self.home_template is not None:  # home as set-up left it
            shutil.copytree(self.home_template, self.box / "home", symlinks=True)
        else:
            (self.box / "home").mkdir()

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
