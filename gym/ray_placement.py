"""Ray placement for the unchanged `RolloutScheduler`: episodes on Ray workers, engines as actors.

Local asyncio stays the default; this module is opt-in and the only place that imports ray
(lazily, so importing it costs nothing without a cluster).

Contract:
- `RayEpisodes(worker_factory, config)` is an `episode_fn` for `RolloutScheduler`. Each call
  runs one episode on one of `num_workers` Ray actors; `worker_factory()` (picklable) builds
  the actor's env worker on its node, an object with `run(slot)` (sync: run in a thread; or
  async) returning a `Trajectory`. The driver keeps admission, η and consumption.
- Versions: the driver publishes the policy version to a `VersionBoard` actor before every
  dispatch (so a worker never sees a version older than its episode's start) and whenever
  it changes while episodes run. A worker's `RemoteSlot.before_turn()` reads it and applies
  the scheduler's per-turn η check; tokens a worker stamps carry a version >= start_version.
- Driver-side watchdog: every `poll_s` the driver also runs the slot's own `before_turn()`
  for each remote episode, so under `requeue` a too-stale episode is cancelled even when its
  turns happen in the proxy (harness episodes), not in worker code. `RolloutWorker` also
  hands the proxy the session's `staleness_limit`, so the proxy refuses the stale turn
  itself (once the driver has told it the version: `POST /admin/policy_version`).
- A cancelled episode (scheduler timeout, staleness, close) kills its actor and starts a
  fresh one when actors run one episode each; with `episodes_per_worker > 1` the task is
  cancelled, and a worker whose `run` takes a `cancel` has its harness tree killed and its
  sandbox closed. The sandbox of a killed actor's episode is left to the backend's reaper
  (containers carry the run's label).
- `EngineActor` wraps any engine server factory (e.g. `functools.partial(EngineServer,
  model="tiny-llama", port=0)`, passed in by the composition root so that gym imports no
  trainer) and exposes its URL; a server bound to 0.0.0.0 is reported at the node's IP.
- `RolloutWorker` is the real env worker: sandbox backend + adapter + tasks of a
  `RolloutConfig`, reaching the proxy by URL (`ProxyHandle`). For workers on other nodes the
  proxy binds an address they reach and sets `ProxyConfig.admin_clients = "any"` (the admin
  token still guards it); their handle has that URL and no `uds_path`. Only single-node
  clusters are tested here.
"""
from __future__ import annotations

import asyncio
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, Field

from harnessrl.gym.scheduler import EpisodeSlot, StaleEpisode, raise_if_aborted_stale, session_meta
from harnessrl.gym.trajectory import Trajectory


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is a dependency
        raise RuntimeError("Ray placement needs ray: pip install ray") from e
    return ray


class RayPlacementConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """Where and how episodes run on Ray."""

    num_workers: int = Field(2, ge=1)
    """Episode actors; size it to the scheduler's env_pool_size / episodes_per_worker."""
    episodes_per_worker: int = Field(1, ge=1)
    """Episodes one actor runs at once (its max_concurrency)."""
    num_cpus_per_worker: float = Field(1.0, ge=0)
    """Ray CPUs each actor reserves."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each actor needs (e.g. {"docker": 1} to land on nodes with Docker)."""
    poll_s: float = Field(0.05, gt=0)
    """How often the driver republishes the version and re-checks a remote episode's staleness."""


class VersionBoard:
    """A Ray actor holding the policy version the driver last published (monotonic)."""

    def __init__(self) -> None:
        self.version = 0

    def set(self, version: int) -> int:
        self.version = max(self.version, int(version))
        return self.version

    def get(self) -> int:
        return self.version


@dataclass
class VersionView:
    """A worker's monotonic view of the board (one per actor, shared by its episodes)."""

    board: Any
    value: int = 0

    async def refresh(self) -> int:
        self.value = max(self.value, int(await self.board.get.remote()))
        return self.value


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
    view: VersionView | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        return max(self.view.value if self.view else 0, self.start_version)

    async def before_turn(self) -> int:
        if self.view is not None:
            await self.view.refresh()
        if self.over_staleness == "requeue" and self.version - self.start_version > self.staleness:
            raise StaleEpisode(f"started at v{self.start_version}, policy now v{self.version}")
        return self.version


class _EpisodeActor:
    """The Ray actor around one env worker (async: cancellable, runs sync workers in threads)."""

    def __init__(self, worker_factory: Callable[[], Any], board: Any):
        self.worker = worker_factory()
        self.view = VersionView(board)

    async def ping(self) -> int:
        return os.getpid()

    async def run(self, info: dict) -> dict:
        import ray

        slot = RemoteSlot(**info, view=self.view)
        await self.view.refresh()
        try:
            if inspect.iscoroutinefunction(self.worker.run):
                traj = await self.worker.run(slot)
            else:
                traj = await self._in_thread(slot)
        except StaleEpisode as e:
            return {"stale": str(e)}
        traj.metadata["placement"] = {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
        return {"trajectory": traj.to_dict()}


    async def _in_thread(self, slot: RemoteSlot) -> Trajectory:
        """A sync worker's episode in a thread; cancelled (`ray.cancel`), a worker whose `run`
        takes a `cancel` gets it set (harness tree killed, sandbox closed) and is waited for."""
        from harnessrl.gym.stack import cancellable

        takes = "cancel" in inspect.signature(self.worker.run).parameters
        return await cancellable(lambda cancel: self.worker.run(slot, *((cancel,) if takes else ())),
                                 "the driver cancelled the episode")


class RayEpisodes:
    """An episode_fn for `RolloutScheduler` that runs each episode on a Ray actor."""

    def __init__(self, worker_factory: Callable[[], Any], config: RayPlacementConfig | None = None):
        ray = _ray()
        if not ray.is_initialized():
            raise RuntimeError("RayEpisodes needs a Ray cluster: call ray.init(...) first")
        self.config = config or RayPlacementConfig()
        self._factory = worker_factory
        self.board = ray.remote(VersionBoard).options(num_cpus=0).remote()
        self.actors = [self._new_actor() for _ in range(self.config.num_workers)]
        self._load = [0] * len(self.actors)
        self._published = -1
        self.replaced = 0
        """Actors killed and restarted after a cancelled episode."""

    def _new_actor(self) -> Any:
        c = self.config
        opts: dict[str, Any] = {"num_cpus": c.num_cpus_per_worker, "max_concurrency": c.episodes_per_worker}
        if c.resources:
            opts["resources"] = dict(c.resources)
        return _ray().remote(_EpisodeActor).options(**opts).remote(self._factory, self.board)

    async def _publish(self, version: int) -> None:
        if version > self._published:
            await self.board.set.remote(version)
            self._published = max(self._published, version)

    async def __call__(self, slot: EpisodeSlot) -> Trajectory:
        ray = _ray()
        sc = slot._sched.config
        await self._publish(slot.version)
        i = min(range(len(self.actors)), key=self._load.__getitem__)
        self._load[i] += 1
        info = {"task_id": slot.task_id, "group_id": slot.group_id, "index": slot.index,
                "start_version": slot.start_version, "attempt": slot.attempt, "staleness": sc.staleness,
                "over_staleness": sc.over_staleness}
        ref = self.actors[i].run.remote(info)
        fut = asyncio.wrap_future(ref.future())
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=self.config.poll_s)
                if done:
                    break
                await self._publish(slot.version)
                await slot.before_turn()  # the driver-side watchdog (raises StaleEpisode under requeue)
            out = fut.result()
        except BaseException:
            if not fut.done():
                if self.config.episodes_per_worker == 1:
                    ray.kill(self.actors[i])
                    self.actors[i] = self._new_actor()
                    self.replaced += 1
                else:
                    ray.cancel(ref)
            raise
        finally:
            self._load[i] -= 1
        if "stale" in out:
            raise StaleEpisode(out["stale"])
        traj = Trajectory.from_dict(out["trajectory"])
        traj.metadata.setdefault("start_version", slot.start_version)
        return traj

    def wait_ready(self, timeout: float = 300.0) -> list[int]:
        """Block until every actor is built (so start-up is not charged to the first episodes'
        timeouts); returns their pids."""
        return _ray().get([a.ping.remote() for a in self.actors], timeout=timeout)

    def shutdown(self) -> None:
        ray = _ray()
        for a in [*self.actors, self.board]:
            ray.kill(a)
        self.actors = []


# -- env workers ------------------------------------------------------------------------------
class SimWorker:
    """Simulated episodes on a worker (gym/doubles/sim.py's engine and episode, one engine per actor):
    for testing placement and sizing pools without sandboxes."""

    def __init__(self, turns: int = 3, tokens_per_turn: int = 4, step_s: float = 0.001, slots: int = 8,
                 latency_mean_s: float = 0.02, latency_cv: float = 1.0, seed: int = 0):
        self.args = (turns, tokens_per_turn, step_s, slots, latency_mean_s, latency_cv, seed)
        self._run = None

    async def run(self, slot: RemoteSlot) -> Trajectory:
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


class RolloutWorker:
    """The episode side of a `Rollout` (the `EpisodeStack` of a `RolloutConfig`: tasks, adapter,
    sandbox backend) for any node; it reaches the proxy (and through it the engine) by URL only.
    `tasks`: the run's tasks, handed from the driver (None: the worker loads the suite)."""

    def __init__(self, config: Any, proxy: Any, tasks: list | None = None):
        from harnessrl.gym.stack import EpisodeStack

        self.config, self.proxy = config, proxy
        # A fresh sandbox per episode: the warm pool is the driver's (`Rollout`), not a worker's.
        self.stack = EpisodeStack(config.model_copy(update={"sandbox_pool_size": 0}), tasks=tasks)
        self.tasks, self.adapter, self.backend = self.stack.tasks, self.stack.adapter, self.stack.backend

    def run(self, slot: Any, cancel: Any = None) -> Trajectory:
        """One episode; its proxy session carries `start_version` and `group_id` (the engine priority) and,
        under `requeue`, `staleness_limit`: a session the proxy aborts as stale raises
        `StaleEpisode`, so the driver reruns the task, as for local episodes. `cancel` (an
        `adapters.cancel.Cancel`) abandons it: harness tree killed, sandbox closed."""
        limit = slot.staleness if slot.over_staleness == "requeue" else None
        res = self.stack.run(slot.task_id, self.proxy, session_meta=session_meta(slot.start_version, limit, slot.group_id),
                             cancel=cancel)
        return raise_if_aborted_stale(res.trajectory, limit)


# -- engines as actors -----------------------------------------------------------------------
class EngineActor:
    """A Ray actor serving an engine made by `server_factory()` (a context manager with `.url`)."""

    def __init__(self, server_factory: Callable[[], Any]):
        self.server = server_factory()
        self.server.__enter__()

    def url(self) -> str:
        url = self.server.url
        if "://0.0.0.0:" in url:
            url = url.replace("0.0.0.0", _ray().util.get_node_ip_address())
        return url

    def stop(self) -> None:
        self.server.__exit__(None, None, None)


def engine_actor(server_factory: Callable[[], Any], num_cpus: float = 1.0, **options: Any) -> Any:
    """Start an `EngineActor` (ray.remote options: num_gpus=..., resources=...); `ray.get(a.url.remote())`."""
    return _ray().remote(EngineActor).options(num_cpus=num_cpus, **options).remote(server_factory)
