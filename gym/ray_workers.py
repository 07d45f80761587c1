"""The env workers a Ray episode actor runs (`gym.ray_placement`): plain code, no ray import.

Contract: a worker is built on its node by a picklable factory and has `run(slot)` (sync, run
in a thread, optionally taking a `cancel`; or async) returning a `Trajectory`; the slot is a
`RemoteSlot` (the `EpisodeSlot` fields, the version the driver pushed, where it runs).
- `RolloutWorker` is the real one: the `EpisodeStack` of a `RolloutConfig` (tasks, adapters,
  the sandbox backend and its own warm pool: `sandbox_pool_size` sandboxes per repository and
  harness, kept on this worker's node), reaching the driver's proxy by URL through a loopback
  door of its own (`loopback_door`: harnesses taken off the network reach only loopback). The engine probe
  (`ProxyHandle.engine_url`: does the engine still answer /health when a harness stopped
  short?) is kept only where that URL means the same engine: a loopback engine URL is the
  driver host's, so a worker on another host gets no probe (`worker_handle`) and its episodes
  are judged by the proxy's record alone (failed calls, their `engine_healthy`), never by
  whatever answers on its own loopback.
- `SimWorker` runs simulated episodes (`gym.doubles.sim`), for placement tests without sandboxes.
"""
from __future__ import annotations

import atexit
import dataclasses
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harnessrl.adapters.relay import Relay
from harnessrl.gym.proxy_admin import ProxyHandle
from harnessrl.gym.scheduler import StaleEpisode, raise_if_aborted_stale, session_meta
from harnessrl.gym.trajectory import Trajectory

class WorkerLost(Exception):
    """The Ray worker running an episode is gone (node died, raylet killed, process crashed)."""


@dataclass
class VersionView:
    """A worker's monotonic view of the policy version the driver pushed (one per actor)."""

    value: int = 0


@dataclass
class RemoteSlot:
    """What a remote episode gets: the `EpisodeSlot` fields and the same per-turn check."""

    task_id: str
    group_id: int
    index: int
    start_version: int
    attempt: int
    staleness: int
    over_staleness: str
    harness: str | None = None
    where: dict | None = None
    """The worker's node id, pid and sandbox run label (its episode's record carries them)."""
    view: VersionView | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        return max(self.view.value if self.view else 0, self.start_version)

    async def before_turn(self) -> int:
        if self.over_staleness == "requeue" and self.version - self.start_version > self.staleness:
            raise StaleEpisode(f"started at v{self.start_version}, policy now v{self.version}")
        return self.version


def is_loopback(url: str | None) -> bool:
    """Does `url` name this host's loopback or any-address (reached only by processes on its host)?"""
    host = urlsplit(url or "").hostname or ""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: whatever it resolves to, it names one host for every node
    return ip.is_loopback or ip.is_unspecified


def worker_handle(handle: ProxyHandle, driver_host: str, here: str | None = None) -> ProxyHandle:
    """The handle a worker on host `here` (default: this host's name) uses: the driver's, less
    an engine URL that names the driver host's loopback when `here` is another host."""
    here = here or socket.gethostname()
    if here != driver_host and is_loopback(handle.engine_url):
        return dataclasses.replace(handle, engine_url=None)
    return handle


def loopback_door(handle: ProxyHandle) -> tuple[ProxyHandle, Relay | None]:
    """A handle at a loopback address of this host, and the byte relay that makes it (None when
    the proxy is on loopback already): a beside harness taken off the network (adapters/netns.py)
    reaches only the proxy's 127.0.0.1:PORT, so a proxy on another host is reached through a
    door of the worker's own, 127.0.0.1:<port> -> the proxy's address."""
    if is_loopback(handle.url):
        return handle, None
    u = urlsplit(handle.url)
    door = Relay("tcp:127.0.0.1:0", f"tcp:{u.hostname}:{u.port or 80}").start("harnessrl-proxy-door")
    port = door.server.getsockname()[1]
    return dataclasses.replace(handle, url=f"http://127.0.0.1:{port}{u.path}".rstrip("/"), uds_path=None), door


class RolloutWorker:
    """The episode side of a `Rollout` for any node (module doc). `tasks`: the run's tasks, handed
    from the driver (None: the worker loads the suite); `driver_host`: the driver's host name
    (None: this worker runs on the driver's host)."""

    def __init__(self, config: Any, proxy: ProxyHandle, tasks: list | None = None, driver_host: str | None = None):
        from harnessrl.gym.stack import EpisodeStack

        self.config = config
        self.proxy, self.door = loopback_door(proxy if driver_host is None else worker_handle(proxy, driver_host))
        self.stack = EpisodeStack(config, tasks=tasks)  # its own backend and warm pool, on this node
        atexit.register(self.stack.close)  # a worker process that ends closes its idle sandboxes
        self.tasks, self.adapter, self.backend = self.stack.tasks, self.stack.adapter, self.stack.backend

    def run(self, slot: Any, cancel: Any = None) -> Trajectory:
        """One episode through the harness of its group (`slot.harness`; None: the run's first);
        its proxy session carries `start_version`, `group_id` (the engine priority), the
        worker's `placement` (`slot.where`: node id, pid, sandbox run label) and,
        under `requeue`, `staleness_limit`: a session the proxy aborts as stale raises
        `StaleEpisode`, so the driver reruns the task, as for local episodes. `cancel` (an
        `adapters.cancel.Cancel`) abandons it: harness tree killed, sandbox closed."""
        limit = slot.staleness if slot.over_staleness == "requeue" else None
        meta = session_meta(slot.start_version, limit, slot.group_id)
        if getattr(slot, "where", None):
            meta["placement"] = dict(slot.where)  # the run's record says where each episode ran
        res = self.stack.run(slot.task_id, self.proxy, cancel=cancel, harness=getattr(slot, "harness", None),
                             session_meta=meta)
        return raise_if_aborted_stale(res.trajectory, limit)

    def describe(self) -> dict:
        """What the driver records of this worker: its sandboxes' run label (a docker backend's
        `run_id`), by which a lost worker's containers are reaped (`harnessrl.sandboxes reap --run-id`)."""
        return {"sandbox_run_id": getattr(self.backend, "run_id", None)}

    def close(self) -> None:
        """The warm pool's idle sandboxes closed, the loopback door shut."""
        self.stack.close()
        if self.door is not None:
            self.door.close()


class SimWorker:
    """Simulated episodes on a worker (gym/doubles/sim.py's engine and episode, one engine per actor):
    for testing placement and sizing pools without sandboxes."""

    def __init__(self, turns: int = 3, tokens_per_turn: int = 4, step_s: float = 0.001, slots: int = 8,
                 latency_mean_s: float = 0.02, latency_cv: float = 1.0, seed: int = 0):
        self.args = (turns, tokens_per_turn, step_s, slots, latency_mean_s, latency_cv, seed)
        self._run = None

    async def run(self, slot: Any) -> Trajectory:
        import random

        from harnessrl.gym.doubles.sim import SimEngine, lognormal, sim_episode

        if self._run is None:  # made on the actor's loop, with its version view
            turns, tokens, step_s, slots, mean, cv, seed = self.args
            engine = SimEngine(slots, step_s, lambda: slot.view.value if slot.view else 0)
            engine.start()
            self._run = sim_episode(engine, turns, tokens, lognormal(mean, cv, random.Random(seed + os.getpid())))
        traj = await self._run(slot)
        traj.metadata["slot"] = [slot.task_id, slot.group_id, slot.index, slot.start_version, slot.attempt]
        return traj
