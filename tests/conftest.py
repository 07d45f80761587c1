"""How the suite runs in parallel (pytest-xdist; `-n 4 --dist loadgroup` in pyproject's addopts).

Three rules, applied at collection, so `python -m pytest` alone gets them:

- **A test that uses a module- or session-scoped fixture runs on the worker that built it**: it
  is put in the xdist group of its module (split by a shared fixture's parameter when every
  shared fixture is built on it: the docker and the local half of a backend-parametrized file
  run on two workers). An engine, a Docker
  image, an installed harness or synthesized tasks are built once, as without xdist. Every other
  test is free to run on any worker.
- **The longest groups start first**: groups are ordered by the seconds a measured run recorded
  (`tests/durations.json`, written by `scripts/suite_timeline.py --write`), else by an estimate
  from their markers (slow, docker, model, harness), so the run does not end waiting on one long
  file that started last (`--no-loadscope-reorder` keeps this order).
- **A few tests run alone** (`SERIAL`): they change the whole machine (every process's CPU
  affinity) or time a kill under load. Such a test takes a lock every other test shares, so it starts only when the tests in
  flight on the other workers have finished, and they start their next only after it.

Without xdist (`-n 0`, one process) the groups and the lock change nothing.

One setting differs from a run's: **the environment does not yield the CPU here**
(`HARNESSRL_ENV_NICE=0`, `HARNESSRL_SANDBOX_NICE=0` unless the caller set them). A training run
puts harness processes at nice 10 and every Docker sandbox together under one cgroup with the
weight of one nice-10 process, so the engine is never starved by its environment. In the suite
four workers keep both cores busy, and a sandbox then got a few per cent of a core: a harness
that starts in 16 s on the host took 194 s to make its first call in a container. The tests
of that policy (tests/test_cpu_priority.py) clear both variables and check the defaults.

The suite's own processes **keep bytecode** even where `PYTHONDONTWRITEBYTECODE` is set (this
machine's image sets it): without it, every worker re-ran pytest's assertion rewriting of every
test module and recompiled harnessrl at each collection, 17.6 s of CPU a worker against 11.4 s
with the cache (measured). Only these processes: the variable stays set for what they start, and
code that runs a task's repository sets `sys.dont_write_bytecode` itself (the synth screener,
the grader's runner), so no bytecode lands in a task's tree.

And **each worker computes on one thread** (`OMP_NUM_THREADS=1`, `MKL_NUM_THREADS=1` in the
workers and the engines and trainers they start, unless the caller set them). Torch sizes its
pool to the machine's cores, so four workers on two cores ran eight spinning OpenMP threads:
two copies of a SmolLM2 decode test at once took 290 s with the default pool and 69 s with one
thread each. With one thread the engine's `cpu_matvec = "auto"` takes its compiled path, as a
`num_threads = 1` engine does; the torch path keeps its own tests (`cpu_matvec = "off"`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.dont_write_bytecode = False  # cache rewritten test modules and our own bytecode (module docstring)
for _var in ("HARNESSRL_ENV_NICE", "HARNESSRL_SANDBOX_NICE"):
    os.environ.setdefault(_var, "0")  # the workers inherit it (see the module docstring)
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")  # one compute thread per worker (see the module docstring)
    if "torch" in sys.modules:  # a plugin imported it before us: its pool is already sized
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

SERIAL = {
    # CoreReservation binds every process of the machine to one core, then gives the masks back
    "tests/test_cpu_priority.py::test_core_reservation_keeps_the_engines_core_for_it_and_gives_every_mask_back":
        "rebinds every process of the machine",
    "tests/test_cpu_priority.py::test_a_reservation_whose_owner_was_killed_is_undone_by_the_next":
        "rebinds every process of the machine",
    # a killed process tree (and a crashed box's cgroup) must be gone when the call returns
    "tests/test_proc.py::test_cancel_kills_the_whole_tree": "times a process tree's death",
    "tests/test_proc.py::test_a_timeout_kills_the_whole_tree": "times a process tree's death",
    "tests/test_prefork.py::test_timeout_and_cancel_kill_the_whole_forked_tree": "times a process tree's death",
    "tests/test_sandboxes.py::test_local_reaper_removes_leftover_boxes": "times a cgroup's removal",
}

_COST = {"slow": 8, "harness": 4, "model": 4, "docker": 2, "bwrap": 2, "ray": 2, "browser": 4}


def _serial(item: pytest.Item) -> bool:
    return item.nodeid.split("@")[0].split("[")[0] in SERIAL  # xdist appends "@group" to the id


def _group(item: pytest.Item) -> str | None:
    """The module (and shared fixture parameter) whose module/session fixture this test uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = [name for name, defs in info.name2fixturedefs.items()  # ours: pytest's own have baseid ""
              if defs and defs[-1].baseid and defs[-1].scope in ("module", "package", "session")]
    if not shared:
        return None
    module = item.nodeid.split("::")[0]
    params = getattr(getattr(item, "callspec", None), "params", {})
    split = [n for n in sorted(shared) if n in params]
    # split by a parameter only when every shared fixture is built on it (a backend fixture and
    # the sandboxes made from it), so the halves share nothing a second worker would build again
    if len(split) == 1 and all(split[0] in _needs(info.name2fixturedefs, n) for n in shared):
        return f"{module}[{split[0]}={params[split[0]]}]"
    return module


def _needs(defs: dict, name: str) -> set[str]:
    """`name` and every fixture it depends on."""
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [a for a in (defs[n][-1].argnames if defs.get(n) else ()) if a in defs]
    return seen


def _cost(item: pytest.Item) -> int:
    return 1 + sum(c for m, c in _COST.items() if item.get_closest_marker(m))


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group or item.nodeid, []).append(item)
    # longest group first (seconds a run measured, else the markers' estimate); within a group,
    # the collected order (module fixtures stay contiguous)
    known = _durations()
    ordered = sorted(groups.items(), key=lambda kv: -known.get(kv[0], _SECONDS_PER_COST * sum(map(_cost, kv[1]))))
    items[:] = [item for _, g in ordered for item in g]


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds per group (or ungrouped test) from a measured run (scripts/suite_timeline.py --write);
a group it does not know is estimated from its markers."""
_SECONDS_PER_COST = 2.0


def _durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


LOCKS = "HARNESSRL_PYTEST_LOCKS"  # the lock folder, made by the controller, inherited by its workers


def pytest_configure(config: pytest.Config) -> None:
    # a run's own, always: a pytest that a test starts (test_bridge_tinker's child) must not
    # wait on the locks of the run that waits for it
    if not hasattr(config, "workerinput"):
        os.environ[LOCKS] = tempfile.mkdtemp(prefix="harnessrl-pytest-")
        config.stash[_MADE] = os.environ[LOCKS]


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE, None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(LOCKS, None)


_MADE = pytest.StashKey[str]()


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    with open(path, "a+") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: waiting is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.get(LOCKS):
        yield
        return
    gate, run = Path(os.environ[LOCKS]) / "gate", Path(os.environ[LOCKS]) / "run"
    if _serial(item):
        # the gate first: no test starts on another worker while this one waits for those in flight
        with _flock(gate, fcntl.LOCK_EX), _flock(run, fcntl.LOCK_EX), _timed(item):
            yield
    else:
        with _flock(gate, fcntl.LOCK_SH):
            pass
        with _flock(run, fcntl.LOCK_SH), _timed(item):
            yield


TIMES = "HARNESSRL_PYTEST_TIMES"
"""A folder: with it set, each worker appends when each of its tests ran (worker, id, start,
end, group), to see a run's critical path (scripts/suite_timeline.py)."""


@contextlib.contextmanager
def _timed(item: pytest.Item):
    folder = os.environ.get(TIMES)
    start, cpu = time.time(), _cpu()
    try:
        yield
    finally:
        if folder:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            group = item.get_closest_marker("xdist_group")
            with open(Path(folder) / f"{worker}.tsv", "a") as f:
                f.write(f"{worker}\t{item.nodeid}\t{start:.3f}\t{time.time():.3f}\t{group.args[0] if group else ''}"
                        f"\t{_cpu() - cpu:.2f}\n")


def _cpu() -> float:
    """CPU seconds of this worker and of its children that ended (engines, harnesses, git, a
    child pytest: reaped ones only; sandboxes' processes are the container engine's, not here)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))

