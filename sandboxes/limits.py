"""Per-sandbox limits for the local backend: memory and pids through cgroups (v1 or v2), disk
through a loop-mounted filesystem of fixed size.

bubblewrap isolates namespaces but limits nothing; a fork bomb or a memory hog inside it would
hit the host. When this process may create cgroups (root with a writable cgroupfs, or a
delegated v2 subtree), every command of a sandbox runs in that sandbox's cgroup; otherwise
`Cgroup.create` returns None and the backend reports its limits as not enforced.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Cgroup:
    """One sandbox's cgroup(s): created with limits, joined by each command, removed at close."""

    def __init__(self, dirs: list[Path], v2: bool):
        self.dirs, self.v2 = dirs, v2

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int) -> "Cgroup | None":
        try:
            if (ROOT / "cgroup.controllers").exists():
                return cls._create_v2(name, memory_bytes, pids)
            return cls._create_v1(name, memory_bytes, pids)
        except OSError:
            return None

    @classmethod
    def _create_v1(cls, name: str, memory_bytes: int, pids: int) -> "Cgroup":
        pid_dir, mem_dir = ROOT / "pids" / "harnessrl" / name, ROOT / "memory" / "harnessrl" / name
        pid_dir.mkdir(parents=True, exist_ok=True)
        mem_dir.mkdir(parents=True, exist_ok=True)
        group = cls([pid_dir, mem_dir], v2=False)
        try:
            _write(pid_dir / "pids.max", str(pids))
            _write(mem_dir / "memory.limit_in_bytes", str(memory_bytes))
            if (mem_dir / "memory.memsw.limit_in_bytes").exists():  # no swapping around the limit
                _write(mem_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))
        except OSError:
            group.remove()
            raise
        return group

    @classmethod
    def _create_v2(cls, name: str, memory_bytes: int, pids: int) -> "Cgroup":
        parent = ROOT / "harnessrl"
        parent.mkdir(exist_ok=True)
        _write(ROOT / "cgroup.subtree_control", "+pids +memory")
        _write(parent / "cgroup.subtree_control", "+pids +memory")
        d = parent / name
        d.mkdir(exist_ok=True)
        group = cls([d], v2=True)
        try:
            _write(d / "pids.max", str(pids))
            _write(d / "memory.max", str(memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        except OSError:
            group.remove()
            raise
        return group

    def procs_files(self) -> list[str]:
        """Files a process writes its pid to, to join (each command's launcher does)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def kill_all(self) -> None:
        if self.v2 and (self.dirs[0] / "cgroup.kill").exists():
            _write(self.dirs[0] / "cgroup.kill", "1")
            return
        for _ in range(20):  # a fork bomb keeps forking while we kill: repeat until empty
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def reap(prefix: str, keep: set[str]) -> None:
        """Remove cgroups named `prefix*` except those in `keep` (left by a crashed run)."""
        for parent in (ROOT / "harnessrl", ROOT / "pids" / "harnessrl", ROOT / "memory" / "harnessrl"):
            for d in parent.glob(prefix + "*") if parent.is_dir() else ():
                if d.name not in keep:
                    try:
                        d.rmdir()  # fails while a process is still inside
                    except OSError:
                        pass

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):  # killed processes take a moment to leave the cgroup
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


class LoopDisk:
    """A sandbox's own ext4 filesystem in a sparse image, loop-mounted on its box directory:
    writes past its size fail with ENOSPC (a disk quota for repo/, tmp/ and home/ together).

    Mounting needs root: elsewhere `create` returns None and the backend says the quota is
    not enforced; as root, a failure (no loop devices, say) raises OSError with the reason.
    The image costs host disk only for blocks the sandbox actually wrote."""

    def __init__(self, image: Path, mountpoint: Path):
        self.image, self.mountpoint = image, mountpoint

    @classmethod
    def create(cls, image: Path, mountpoint: Path, size_bytes: int) -> "LoopDisk | None":
        if os.geteuid() != 0:
            return None
        disk = cls(image, mountpoint)
        try:
            with open(image, "wb") as f:
                f.truncate(size_bytes)
            # No journal (a sandbox never outlives a crash), no root reserve (the agent is not root).
            subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-i", "8192", str(image)],
                           check=True, capture_output=True, timeout=120)
            subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)],
                           check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            disk.remove()
            detail = getattr(e, "stderr", b"") or b""
            raise OSError(f"cannot loop-mount a {size_bytes}-byte filesystem for a sandbox: {e} "
                          f"{detail.decode('utf-8', 'replace').strip()[-300:]}") from None
        shutil.rmtree(mountpoint / "lost+found", ignore_errors=True)
        return disk

    def remove(self) -> None:
        umount(self.mountpoint)
        try:
            self.image.unlink()
        except FileNotFoundError:
            pass


def umount(path: Path) -> None:
    """Unmount `path` if something is mounted there (lazily if it is still busy)."""
    if not os.path.ismount(path):
        return
    if subprocess.run(["umount", str(path)], capture_output=True, timeout=120).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=120)
