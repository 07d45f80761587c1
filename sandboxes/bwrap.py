"""How one command enters a bubblewrap sandbox: the launch chain around `bwrap`.

Contract: the sandboxed process never holds host root. When this process is root, a launch
shell joins the sandbox's cgroup while still root, then `setpriv` drops to the unprivileged
host uid/gid of the config (no groups, no new privileges) and only then runs `bwrap`, whose
user namespace maps that uid to 1000 inside (no nested user namespaces). A bind source that
uid cannot look up (under a 0700 /root, say) is first bind-mounted, as root, onto a staging
point in a private mount namespace of that launch (`unshare --mount`; nothing shows on the
host). Not root: bwrap runs as this process's uid, as it always did. Either way bwrap and
its PID 1 start from an allowlisted environment (nothing of the host's leaks into
/proc/*/environ), get a fresh /proc of their own PID namespace and a fresh /dev (hence an
empty /dev/shm, and new IPC) per command, and read their options from a memfd (`--args`),
so host paths and env values do not show in /proc/1/cmdline. Inside, a one-line bash writes
one byte to a pipe (and closes it) right before it enters the workdir and becomes the
command: no byte means the launch failed before the command ran, raised as SandboxError;
everything after the byte (a workdir the agent deleted included) is the command's own exit.
"""
from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The only variables a sandbox starts with, before its own and the exec's env.
BASE_ENV = {"PATH": SAFE_PATH, "HOME": "/home/agent", "USER": "agent", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1"}
INSIDE_UID = 1000


def isolation() -> list[str]:
    """What every sandboxed command gets: all namespaces new (no network), no nested user
    namespaces (no "root" in one, less kernel to attack), no capabilities, uid 1000, the
    system dirs read-only, its own /proc and /dev, an empty environment to fill."""
    return ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox",
            *system_binds(), "--proc", "/proc", "--dev", "/dev", "--chdir", "/", "--clearenv"]


def system_binds() -> list[str]:
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def _tool(name: str) -> str:
    path = shutil.which(name, path=SAFE_PATH)
    if path is None:
        raise FileNotFoundError(f"{name} not found on {SAFE_PATH}")
    return path


@dataclass(frozen=True)
class Identity:
    """Who runs sandboxed processes on the host: `uid`/`gid` when we are root, else ourselves."""

    uid: int
    gid: int

    @property
    def drops(self) -> bool:
        """Whether launching drops root (this process is root)."""
        return os.geteuid() == 0


@dataclass
class Launch:
    """One prepared command: `argv` for Popen with `env` and `pass_fds`; `after_spawn()` once
    Popen returned, `started()` once the process exited."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    started_read: int
    _child_fds: list[int] = field(default_factory=list)

    def after_spawn(self) -> None:
        """Close the child's ends in this process (the child holds its own copies)."""
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds.clear()

    def started(self) -> bool:
        """After the process exited: whether the launch got as far as running the command."""
        try:  # non-blocking: a byte is there or it never will be (no writer outlives the tree)
            os.set_blocking(self.started_read, False)
            return os.read(self.started_read, 1) == b"x"
        except BlockingIOError:
            return False
        finally:
            os.close(self.started_read)

    def abandon(self) -> None:
        """Close every fd (when Popen itself failed)."""
        self.after_spawn()
        os.close(self.started_read)


#: Staging mountpoints live here (empty dirs and files on the host; bind mounts only ever in a
#: launch's private mount namespace), one dir per sandbox, named by the backend.
STAGE_ROOT = Path("/run/harnessrl-bwrap-stage")


def reachable(path: str, identity: Identity) -> bool:
    """Whether `identity` may look `path` up (search permission on every ancestor)."""
    for d in reversed(Path(os.path.realpath(path)).parents):
        try:
            st = os.stat(d)
        except OSError:
            return False
        if st.st_uid == identity.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == identity.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


class Binds:
    """One sandbox's bind mounts (flag `--bind`/`--ro-bind`, host source, sandbox target).

    Dropping root, a source the sandbox uid cannot look up (say under a 0700 /root or a
    pytest tmp dir) gets a staging point: each launch bind-mounts the source there as root,
    in its private mount namespace, and bwrap binds the staging point instead."""

    def __init__(self, identity: Identity, name: str, binds: list[tuple[str, str, str]]):
        self.dir: Path | None = None
        self.entries: list[tuple[str, str, str, str | None]] = []
        for i, (flag, src, dst) in enumerate(binds):
            point = None
            if identity.drops and not reachable(src, identity):
                if self.dir is None:
                    self.dir = STAGE_ROOT / name
                    self.dir.mkdir(parents=True, exist_ok=True)
                    for d in (STAGE_ROOT, self.dir):  # whatever the umask: the uid must look them up
                        os.chmod(d, 0o755)
                pp = self.dir / str(i)
                pp.mkdir(exist_ok=True) if os.path.isdir(src) else pp.touch()
                point = str(pp)
            self.entries.append((flag, src, dst, point))

    def remove(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def reap(prefix: str, keep: set[str]) -> None:
        """Remove staging dirs named `prefix*` except those in `keep` (left by a crashed run)."""
        for d in STAGE_ROOT.glob(prefix + "*") if STAGE_ROOT.is_dir() else ():
            if d.name not in keep:
                shutil.rmtree(d, ignore_errors=True)


def prepare(bwrap_args: list[str], binds: Binds, command: list[str], workdir: str, env: dict[str, str],
            identity: Identity, cgroup_procs: list[str] = (), fsize: int | None = None) -> Launch:
    """The launch chain for `bwrap <bwrap_args> <binds> -- <command>` run in `workdir`; bwrap
    reads its options (host paths, env values), not the command, from a memfd. `fsize`:
    RLIMIT_FSIZE (bytes) of every process of the command.

    The marker changes into `workdir` after its byte, not bwrap (`--chdir`) before: a workdir
    the agent deleted or chmod-ed is the agent's failed command, not a failed launch."""
    memfd = started_r = started_w = None
    lines = [f"echo $$ > {shlex.quote(f)}" for f in cgroup_procs]
    if fsize is not None:  # POSIX sh counts -f in 512-byte blocks; sets the soft and hard limit
        lines.append(f"ulimit -f {max(1, fsize // 512)}")
    args = list(bwrap_args)
    for flag, src, dst, point in binds.entries:
        if point is not None:
            lines.append(shlex.join([_tool("mount"), "--rbind", "--", src, point]))
        args += [flag, point or src, dst]
    private_ns = any(e[3] is not None for e in binds.entries)
    try:
        memfd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)  # pass_fds hands it to the child only
        os.write(memfd, b"".join(a.encode() + b"\0" for a in args))
        os.lseek(memfd, 0, os.SEEK_SET)
        started_r, started_w = os.pipe()
        mark = (f'printf x >&{started_w} && exec {started_w}>&- && cd -- "$1" && unset OLDPWD && shift '
                '&& exec "$@"')
        tail = [_tool("bwrap"), "--args", str(memfd), "--", "bash", "-p", "-c", mark, "harnessrl-start",
                workdir, *command]  # -p: no BASH_ENV, no imported functions can stop the byte
        if identity.drops:
            tail = [_tool("setpriv"), f"--reuid={identity.uid}", f"--regid={identity.gid}",
                    "--clear-groups", "--no-new-privs", "--", *tail]
        # Every signal at its default: a signal ignored where harnessrl runs (SIGHUP under
        # nohup) would be inherited by the agent's commands, and a shell cannot un-ignore it.
        tail = [_tool("env"), "--default-signal", "--", *tail]
        script = "set -e\n" + "".join(line + "\n" for line in lines) + "exec " + shlex.join(tail)
        argv = [_tool("sh"), "-c", script]
        if private_ns:
            argv = [_tool("unshare"), "--mount", "--propagation", "private", "--", *argv]
        launch = Launch(argv, dict(env), (memfd, started_w), started_r, [memfd, started_w])
        memfd = started_r = started_w = None
        return launch
    finally:
        for fd in (memfd, started_r, started_w):
            if fd is not None:
                os.close(fd)


def userns_hint() -> str:
    return ("bubblewrap needs unprivileged user namespaces for the sandbox uid (check "
            "/proc/sys/user/max_user_namespaces > 0 and kernel.unprivileged_userns_clone=1 or "
            "kernel.apparmor_restrict_unprivileged_userns=0)")


def probe(identity: Identity) -> str | None:
    """None when a minimal sandbox runs here as it will for real; else what failed."""
    if not shutil.which("bwrap", path=SAFE_PATH):
        return "bwrap is not installed (apt-get install bubblewrap)"
    try:
        launch = prepare(isolation(), Binds(identity, "probe", []), ["true"], "/", dict(BASE_ENV), identity)
    except FileNotFoundError as e:
        return str(e)
    try:
        proc = subprocess.run(launch.argv, env=launch.env, pass_fds=launch.pass_fds, cwd="/",
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        launch.abandon()
        return f"bwrap probe failed: {e}"
    launch.after_spawn()
    ok = launch.started() and proc.returncode == 0
    return None if ok else (f"bwrap probe failed (exit {proc.returncode}): "
                            f"{proc.stderr.decode('utf-8', 'replace')[-500:]}; {userns_hint()}")
