"""Per-sandbox memory and pids limits for the local backend, through cgroups (v1 or v2).

bubblewrap isolates namespaces but limits nothing; a fork bomb or a memory hog inside it would
hit the host. When this process may create cgroups (root with a writable cgroupfs, or a
delegated v2 subtree), every command of a sandbox runs in that sandbox's cgroup; otherwise
`Cgroup.create` returns None and the backend reports its limits as not enforced.
"""
from __future__ import annotations

import os
import signal
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
