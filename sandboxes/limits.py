"""Per-sandbox limits for the local backend: memory and pids through cgroups (v1 or v2), disk
through a loop-mounted filesystem of fixed size.

bubblewrap isolates namespaces but limits nothing; a fork bomb or a memory hog inside it would
hit the host. When this process may create cgroups (root with a writable cgroupfs, or a
delegated v2 subtree), every command of a sandbox runs in that sandbox's cgroup; otherwise
`Cgroup.create` returns None and the backend reports its limits as not enforced.
"""
from __future__ import annotations

import json
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


ENV_NICE = 10
"""How much lower the environment's CPU priority is than harnessrl's (and its engine's): the
harness processes and the local sandboxes' commands get this nice value, and Docker sandboxes
(whose processes the kernel weighs by their cgroup, not their nice value) a cgroup of that
weight (`docker_cgroup_parent`). Override with HARNESSRL_ENV_NICE (0: the same priority, at
most 19)."""


def _nice_from(variable: str) -> int | None:
    """A nice value 0-19 from the environment variable, None when it is unset or empty."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{variable} must be an integer 0-19, not {raw!r}") from None
    if not 0 <= value <= 19:
        raise ValueError(f"{variable} must be an integer 0-19, not {raw!r}")
    return value


def env_nice() -> int:
    value = _nice_from("HARNESSRL_ENV_NICE")
    return ENV_NICE if value is None else value


def sandbox_nice() -> int:
    """The nice value of the sandboxes' work (their commands, hidden tests and resets; for Docker,
    the weight of their cgroup): HARNESSRL_SANDBOX_NICE (0-19), else `env_nice()`'s. Apart from
    the harness processes' because they weigh differently: each harness session is weighed on
    its own, while every Docker sandbox of the machine shares the one cgroup's weight, so at
    nice 10 forty sandboxes together weigh as much as one harness; with the engine's stepping
    thread on a core of its own (`CoreReservation`) nothing needs them that low, and their work
    (a command the harness waits for, the hidden tests a finished episode waits for) is what
    the episodes wait on (bench/async_real.py sets 0 then)."""
    value = _nice_from("HARNESSRL_SANDBOX_NICE")
    return env_nice() if value is None else value


def yield_cpu(pid: int, group: bool = True, nice: int | None = None) -> bool:
    """Lower the CPU priority of `pid`, a process that leads its own session (a harness, a
    sandbox command), by `env_nice()`, so that with every core busy the
    engine and harnessrl's own threads get the CPU first and the environment the rest; when
    the machine is idle it runs at full speed. Both knobs: the process's nice value (inherited
    by what it starts), and, where the kernel groups each session for the scheduler
    (`sched_autogroup`, on by default on desktop and many server kernels), its session's group
    nice; without the latter a nice value counts only inside its own session, and every
    harness session would weigh as much as the engine's. Measured on the 2-core dev VM, one
    busy process beside three busy sessions for 6 s: it got 49% of a core with the sessions at
    group nice 0, 98% with them at 10 (the three shared the other core). Best effort (False
    when neither could be set); refuses (ValueError) a process that does not lead its session,
    whose group is someone else's too. The kernel lets an unprivileged process set a group nice
    at most once per 0.1 s machine-wide (root is not limited); a launch that meets the limit
    keeps group nice 0. `group=False`: the nice value only (for a process whose work runs in a
    session of its own further down, as bwrap's `--new-session` starts). `nice`: in place of
    `env_nice()` (a sandbox's command: `sandbox_nice()`)."""
    nice = env_nice() if nice is None else nice
    if nice <= 0:
        return False
    try:
        if os.getsid(pid) != pid:
            raise ValueError(f"process {pid} does not lead its own session: its group is shared")
    except ProcessLookupError:
        return False
    done = False
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice))
        done = True
    except OSError:
        pass
    if not group:
        return done
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        done = True
    except OSError:  # no autogroup support, or not ours
        pass
    return done


SANDBOX_CGROUP = "harnessrl-sandboxes"
"""The cgroup every Docker sandbox of this machine's runs is placed under (`docker_cgroup_parent`)."""


def nice_weight(nice: int) -> int:
    """The kernel's scheduler weight of a process at `nice` (its `sched_prio_to_weight` table:
    1024 at nice 0, each step ~1.25x): 110 at nice 10, 15 at 19."""
    return max(2, round(1024 / 1.25 ** nice))


def docker_cgroup_parent(driver: str, version: str) -> tuple[str | None, str]:
    """The cgroup parent for Docker sandboxes that makes their processes yield the CPU to the
    engine like the harness processes do (`yield_cpu`), and why (one line for the log).

    Docker places each container in a cgroup of its own, under `/docker` by default: the kernel
    weighs that group (1024 shares, v1; weight 100, v2) as one nice-0 process against the
    engine's thread, so every sandbox's commands and hidden tests together take as much of a
    busy core as the engine, however nice their processes are inside. This creates
    `/harnessrl-sandboxes` (in the hierarchy of v1's cpu controller; a child of the root with
    the cpu controller on v2) with the weight of a process at `env_nice()` (`nice_weight`: 110
    shares at 10, weight 11 on v2) and returns it, for `cgroup_parent`: with every core busy the
    containers then share the weight of one niced process, and on an idle machine they run
    at full speed (a weight limits nothing then; each container's own `cpus` quota still
    applies). None, leaving Docker's default, when the environment does not yield
    (`HARNESSRL_ENV_NICE=0`), Docker uses the systemd cgroup driver (which takes only
    slices), or this process cannot write the cgroup files (not root). The nice value is
    `sandbox_nice()` (HARNESSRL_SANDBOX_NICE, else HARNESSRL_ENV_NICE's)."""
    nice = sandbox_nice()
    if nice <= 0:
        return None, "sandbox nice 0 (HARNESSRL_SANDBOX_NICE / HARNESSRL_ENV_NICE): sandboxes keep Docker's cgroup weight"
    if driver != "cgroupfs":
        return None, f"Docker's cgroup driver is {driver!r}, not cgroupfs: sandboxes keep its cgroup weight"
    shares = nice_weight(nice)
    try:
        if version == "2":
            if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
                _write(ROOT / "cgroup.subtree_control", "+cpu")
            d = ROOT / SANDBOX_CGROUP
            d.mkdir(exist_ok=True)
            _write(d / "cpu.weight", str(max(1, round(shares * 100 / 1024))))
        else:
            for controller in ("cpu", "cpu,cpuacct"):
                if (ROOT / controller / "cpu.shares").exists():
                    d = ROOT / controller / SANDBOX_CGROUP
                    d.mkdir(exist_ok=True)
                    _write(d / "cpu.shares", str(shares))
                    break
            else:
                return None, "no cgroup v1 cpu controller is mounted: sandboxes keep Docker's cgroup weight"
    except OSError as e:
        return None, f"cannot set the sandboxes' cgroup weight ({e.strerror}): they keep Docker's"
    return "/" + SANDBOX_CGROUP, f"sandboxes run under /{SANDBOX_CGROUP} at the CPU weight of nice {nice}"


def _tasks(pid: int) -> list[int]:
    """The thread ids of process `pid` (its tasks), [] when it is gone."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _user_pids() -> list[int]:
    """Every process of the machine but kernel threads (children of kthreadd, PID 2)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or d == "2":
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != 2:
            out.append(int(d))
    return out


def _start_time(pid: int) -> int | None:
    """Process `pid`'s start time in clock ticks since boot (/proc/PID/stat field 22), None when
    it is gone: with the pid, it names one process (a pid alone may have been reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _default_ledger() -> Path:
    # harnessrl's cache root, as `harnessrl.gym.models.home` names it (sandboxes imports no gym)
    return Path(os.environ.get("HARNESSRL_HOME", Path.home() / ".cache" / "harnessrl")) / "core-reservation.json"


def recover_left_behind(ledger: Path | None = None) -> int:
    """Undo a reservation whose owner died without `release()` (killed -9, a crash): every task
    still bound to exactly its engine or its environment cores (the moved tasks and everything
    started since, which inherited the environment's) gets the cores of both back. Returns the
    tasks restored; 0 when there is no ledger or its owner is alive (a reservation in force is
    left alone). One killed bench left the whole machine, the shell included, on one core: every
    later run found one core, reserved nothing and ran its engine beside forty harnesses."""
    ledger = ledger or _default_ledger()
    try:
        data = json.loads(ledger.read_text())
        owner, start = int(data["owner"]), data["owner_start"]
        env, engine = set(data["env"]), set(data["engine"])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError):
        ledger.unlink(missing_ok=True)  # unreadable: nothing to go by
        return 0
    now = _start_time(owner)
    if now is not None and (start is None or now == start):
        return 0  # its owner runs: a reservation in force
    full, n = env | engine, 0
    for pid in _user_pids():
        for tid in _tasks(pid):
            try:
                if os.sched_getaffinity(tid) in (env, engine):
                    os.sched_setaffinity(tid, full)
                    n += 1
            except OSError:
                pass
    ledger.unlink(missing_ok=True)
    return n


class CoreReservation:
    """Cores kept for the generator alone: the CPU analogue of "the environment never holds the
    generator's GPU". The engine's stepping thread (`tids`: the engine scheduler's
    `native_tid`, reported by `/get_model_info` as `scheduler_tid`; or every thread of a process)
    is bound to the reserved cores and every other task of the machine (this process, the
    engine's own HTTP threads, the Docker daemons, running sandboxes; kernel threads excepted) to
    the rest; threads and processes started afterwards inherit their parent's set, so harnesses,
    containers (from containerd's shims) and hidden tests stay off the reserved cores.
    Without it the environment's processes, however nice, land on the engine's core whenever
    both cores are busy: the engine then waits for a CPU (its runqueue wait, seen at 8.5% of a
    run on 2 cores with harness processes at nice 10). Binding the whole engine process instead
    puts its HTTP thread (requests, detokenizing, streaming) on the stepping thread's core: on 2
    cores that made a full-batch turn 23% slower in the stack than alone, against 0% unbound.
    `release()` restores every mask it changed (of the tasks still running). Needs at least
    `cores + 1` cores in this process's set and the right to set other processes' affinity
    (root, or the same user for one's own; those it may not move are counted in `skipped`)."""

    def __init__(self, tids: list[int], cores: int = 1, ledger: Path | None = None):
        self.ledger = ledger or _default_ledger()
        self.recovered = recover_left_behind(self.ledger)
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) <= cores:
            raise ValueError(f"cannot reserve {cores} core(s) for the engine: this process may use "
                             f"{len(allowed)} ({allowed})")
        self.engine = set(allowed[-cores:])
        self.env = set(allowed[:-cores])
        self.tids = list(tids)
        self._saved: dict[int, set[int]] = {}
        self.moved = self.skipped = 0
        for tid in self.tids:
            self._set(tid, self.engine)
        if not self.moved:
            raise ValueError(f"cannot bind the engine's thread(s) {self.tids} to cores {sorted(self.engine)}")
        # The ledger first, so a reservation killed while it moves tasks is undone by the next.
        self.ledger.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger.with_name(self.ledger.name + f".{os.getpid()}")
        tmp.write_text(json.dumps({"owner": os.getpid(), "owner_start": _start_time(os.getpid()),
                                   "env": sorted(self.env), "engine": sorted(self.engine)}))
        tmp.replace(self.ledger)
        keep = set(self.tids)
        for pid in _user_pids():
            for tid in _tasks(pid):
                if tid not in keep:
                    self._set(tid, self.env)

    @classmethod
    def for_process(cls, pid: int, cores: int = 1) -> "CoreReservation":
        """Every thread of process `pid` on the reserved cores."""
        return cls(_tasks(pid), cores)

    def _set(self, tid: int, cores: set[int]) -> None:
        try:
            before = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
        except OSError:  # gone, or not ours to move
            self.skipped += 1
            return
        self._saved.setdefault(tid, before)
        self.moved += 1

    def release(self) -> None:
        """Give every moved task (still running) its mask back, and drop the ledger."""
        for tid, cores in self._saved.items():
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:
                pass
        self._saved.clear()
        try:
            if json.loads(self.ledger.read_text()).get("owner") == os.getpid():
                self.ledger.unlink()
        except (OSError, ValueError):
            pass

    def describe(self) -> str:
        return (f"engine thread(s) {self.tids} alone on core(s) {sorted(self.engine)}, everything else on {sorted(self.env)} "
                f"({self.moved} tasks moved, {self.skipped} not movable"
                + (f"; {self.recovered} tasks freed from a killed run's reservation first" if self.recovered else "")
                + ")")
