"""Ray placement for the unchanged `RolloutScheduler`: episodes on Ray workers over many nodes.

Opt-in, and the only place that imports ray (lazily: importing it costs nothing without a cluster).

Contract:
- `RayEpisodes(worker_factory, config)` is an `episode_fn` for `RolloutScheduler`. Each call
  runs one episode on one of `num_workers` Ray actors, each asking for `num_cpus_per_worker`
  and its `resources` (a list: worker i takes entry i mod its length, so workers can be pinned
  to nodes by custom resources) and otherwise spread over the nodes (`SPREAD`). An episode
  goes to the least-loaded worker that is up and has a free slot (`episodes_per_worker`),
  waiting for one otherwise; a worker that cannot be placed (no node has its resources) takes
  no episode. `worker_factory()` (picklable) builds the actor's env worker on its node
  (`gym.ray_workers`: `RolloutWorker` has its own sandbox backend and warm pool there). The
  driver keeps admission, η and consumption.
- Versions are pushed: `publish(version)` (`gym.stack.Publisher` calls it last, after the
  scheduler and the proxy) sends the version to every worker (`set_version`, answered on a
  slot of its own beside the episodes), and a new worker is built at the current version;
  a worker's `RemoteSlot.before_turn()` applies the scheduler's per-turn η check to it, so
  tokens a worker stamps carry a version >= start_version. Under `requeue` each published
  version re-runs the slot's `before_turn()` on the driver for each remote episode (the proxy
  also refuses a stale turn itself), so a too-stale harness episode is cancelled.
- A lost worker (its node died, its raylet was killed, its process crashed) ends its episode
  with `WorkerLost`, which the scheduler records as a masked `infra_error` naming it; the
  worker is replaced by a fresh one with the same resources, used once it is placed; the run
  goes on on the workers that are up. Its sandboxes are left to the backend's reaper (the
  error names their run label). A replacement that dies being built is not rebuilt.
- A cancelled episode (scheduler timeout, staleness, close) kills its actor and starts a fresh
  one when actors run one episode each; else its task is cancelled (a worker whose `run` takes
  a `cancel` has its harness tree killed and its sandbox closed).
- `RayRun` is the `"ray"` placement of `harnessrl train` (`gym.placement.PLACEMENTS`): it
  connects to the cluster (`address`), binds the run's proxy where workers reach it
  (`proxy_host`, admin API open to any client behind its token) and runs `RolloutWorker`s.
- `EngineActor` serves an engine from a server factory the composition root passes in (gym
  imports no trainer) and reports its URL (0.0.0.0 as the node's IP).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, Field

from harnessrl.gym.failures import describe
from harnessrl.gym.ray_workers import RemoteSlot, RolloutWorker, VersionView, WorkerLost
from harnessrl.gym.scheduler import EpisodeSlot, StaleEpisode
from harnessrl.gym.trajectory import Trajectory


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is a dependency
        raise RuntimeError("Ray placement needs ray: pip install ray") from e
    return ray


class RayPlacementConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """Where and how episodes run on Ray."""

    address: str | None = None
    """The Ray cluster to join (`ray.init(address=...)`: "auto", "ray://host:10001", a GCS
    "host:port"); None: a one-node Ray started for the run. Ignored when Ray is already initialized."""
    num_workers: int = Field(2, ge=1)
    """Episode actors; give them env_pool_size / episodes_per_worker slots in all."""
    episodes_per_worker: int = Field(1, ge=1)
    """Episodes one actor runs at once."""
    num_cpus_per_worker: float = Field(1.0, ge=0)
    """Ray CPUs each actor reserves."""
    resources: dict[str, float] | list[dict[str, float]] = Field(default_factory=dict)
    """Custom Ray resources each actor needs (e.g. {"docker": 1} to land on nodes with Docker);
    a list: worker i needs entry i mod its length (e.g. [{"node_a": 1}, {"node_b": 1}] pins
    alternate workers to the nodes started with those resources)."""
    proxy_host: str | None = None
    """The address the run's proxy binds so workers on every node reach it (its admin API then
    accepts any client that has the run's token); None: this node's IP as Ray sees it."""
    ready_timeout_s: float = Field(300.0, gt=0)
    """How long the run waits at start for every worker to be placed and built (a worker whose
    resources no node has fails the run here, naming them)."""


class _EpisodeActor:
    """The Ray actor around one env worker (async: cancellable, runs sync workers in threads)."""

    def __init__(self, worker_factory: Callable[[], Any], version: int):
        import ray

        self.worker = worker_factory()
        self.where = {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                      **getattr(self.worker, "describe", dict)()}
        self.view = VersionView(version)

    async def ping(self) -> dict:
        return self.where

    async def set_version(self, version: int) -> int:
        self.view.value = max(self.view.value, int(version))
        return self.view.value

    async def run(self, info: dict) -> dict:
        slot = RemoteSlot(**info, where=dict(self.where), view=self.view)
        try:
            if inspect.iscoroutinefunction(self.worker.run):
                traj = await self.worker.run(slot)
            else:
                traj = await self._in_thread(slot)
        except StaleEpisode as e:
            return {"stale": str(e)}
        traj.metadata["placement"] = dict(self.where)
        return {"trajectory": traj.to_dict()}

    async def close(self) -> None:
        close = getattr(self.worker, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    async def _in_thread(self, slot: RemoteSlot) -> Trajectory:
        """A sync worker's episode in a thread; cancelled (`ray.cancel`), a worker whose `run`
        takes a `cancel` gets it set (harness tree killed, sandbox closed) and is waited for."""
        from harnessrl.gym.stack import cancellable

        takes = "cancel" in inspect.signature(self.worker.run).parameters
        return await cancellable(lambda cancel: self.worker.run(slot, *((cancel,) if takes else ())),
                                 "the driver cancelled the episode")


@dataclass
class _Worker:
    """The driver's view of one actor: its place in the config, its readiness, its load."""

    index: int
    actor: Any
    ping: Any  # ray ObjectRef of `ping`: resolves once the actor is placed and built
    load: int = 0
    up: bool = True
    where: dict = field(default_factory=dict)
    _ready: Any = None  # the asyncio future of `ping`, made on the driver's loop

    def ready(self) -> "asyncio.Future":
        self._ready = self._ready or asyncio.wrap_future(self.ping.future())
        return self._ready

    def placed(self) -> bool:
        return self._ready is not None and self._ready.done() and not self._ready.exception()


class _Beacon:
    """An event that wakes every current waiter and resets (slots freed, versions published)."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def wait(self) -> "asyncio.Task":
        self._event = self._event or asyncio.Event()
        return asyncio.ensure_future(self._event.wait())

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


class RayEpisodes:
    """An episode_fn for `RolloutScheduler` that runs each episode on a Ray actor (module doc)."""

    def __init__(self, worker_factory: Callable[[], Any], config: RayPlacementConfig | None = None):
        ray = _ray()
        if not ray.is_initialized():
            raise RuntimeError("RayEpisodes needs a Ray cluster: call ray.init(...) first")
        self.config = config or RayPlacementConfig()
        self._factory = worker_factory
        self._published = 0
        self.workers = [self._spawn(i) for i in range(self.config.num_workers)]
        self._freed, self._versions = _Beacon(), _Beacon()
        self.replaced = 0
        """Actors killed and restarted after a cancelled episode."""
        self.lost = 0
        """Workers lost under a running episode (node died, process crashed) and replaced."""
        self.failed_starts: list[str] = []
        """Why each replacement that died while being built did (it is not built again)."""

    def _resources(self, i: int) -> dict[str, float]:
        r = self.config.resources
        return dict(r[i % len(r)] if isinstance(r, list) else r) if r else {}

    def _spawn(self, i: int) -> _Worker:
        c = self.config
        opts: dict[str, Any] = {"num_cpus": c.num_cpus_per_worker, "max_concurrency": c.episodes_per_worker + 1,
                                "scheduling_strategy": "SPREAD"}  # + 1: a slot for pings and version pushes
        if self._resources(i):
            opts["resources"] = self._resources(i)
        actor = _ray().remote(_EpisodeActor).options(**opts).remote(self._factory, self._published)
        return _Worker(i, actor, actor.ping.remote())

    async def publish(self, version: int) -> None:
        """Push `version` to every worker (and to those built later); under `requeue` the running
        episodes' staleness is re-checked."""
        if version <= self._published:
            return
        self._published = version
        # every worker gets it; only the built ones are waited for (a pending one applies it once built)
        refs = {id(w): w.actor.set_version.remote(version) for w in self.workers}
        pushes = [asyncio.wrap_future(refs[id(w)].future()) for w in self.workers if w.placed()]
        if pushes:  # a lost worker is its episode's business, and a dying node holds no trainer back
            await asyncio.wait(pushes, timeout=30)
            for p in pushes:
                p.add_done_callback(lambda f: f.cancelled() or f.exception())  # consumed: nothing logged
        self._versions.fire()

    async def _acquire(self) -> _Worker:
        """The least-loaded placed worker with a free slot, waiting for one."""
        while True:
            for w in self.workers:
                if w.up and w.ready().done() and w.ready().exception() is not None:
                    w.up = False  # it died being built: not rebuilt (a worker that cannot start would loop)
                    self.failed_starts.append(describe(w.ready().exception()).splitlines()[0][:300])
            if not any(w.up for w in self.workers):
                raise RuntimeError(f"no Ray episode worker is up; the last failed to start: {self.failed_starts[-1]}")
            free = [w for w in self.workers if w.up and w.placed() and w.load < self.config.episodes_per_worker]
            if free:
                w = min(free, key=lambda x: x.load)
                w.load += 1
                w.where = w.ready().result()
                return w
            freed = self._freed.wait()
            try:
                await asyncio.wait([w.ready() for w in self.workers if w.up and not w.ready().done()] + [freed],
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                freed.cancel()

    def _replace(self, w: _Worker, lost: bool) -> None:
        """A fresh actor with `w`'s resources in its place (used once placed), `w`'s killed."""
        if not w.up:
            return
        w.up = False
        with contextlib.suppress(Exception):  # already gone with its node
            _ray().kill(w.actor)
        self.workers[next(i for i, x in enumerate(self.workers) if x is w)] = self._spawn(w.index)
        if lost:
            self.lost += 1
        else:
            self.replaced += 1
        self._freed.fire()

    async def __call__(self, slot: EpisodeSlot) -> Trajectory:
        ray = _ray()
        sc = slot._sched.config
        await self.publish(slot.version)
        w = await self._acquire()
        info = {"task_id": slot.task_id, "group_id": slot.group_id, "index": slot.index,
                "start_version": slot.start_version, "attempt": slot.attempt, "staleness": sc.staleness,
                "over_staleness": sc.over_staleness, "harness": slot.harness}
        ref = w.actor.run.remote(info)
        fut = asyncio.wrap_future(ref.future())
        try:
            out = await self._watch(fut, slot, sc.over_staleness == "requeue")
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as e:
            self._replace(w, lost=True)
            left = w.where.get("sandbox_run_id")
            raise WorkerLost(f"the Ray worker running this episode was lost (node {w.where.get('node_id', '?')}, "
                             f"pid {w.where.get('pid', '?')}){f'; its sandboxes (run id {left}) are left to the reaper' if left else ''}: "
                             f"{describe(e).splitlines()[0][:300]}") from None
        except BaseException:
            if not fut.done():
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # its end is moot: taken
                if self.config.episodes_per_worker == 1:
                    self._replace(w, lost=False)
                else:
                    ray.cancel(ref)
            raise
        finally:
            w.load -= 1
            self._freed.fire()
        if "stale" in out:
            raise StaleEpisode(out["stale"])
        traj = Trajectory.from_dict(out["trajectory"])
        traj.metadata.setdefault("start_version", slot.start_version)
        return traj

    async def _watch(self, fut: "asyncio.Future", slot: EpisodeSlot, requeue: bool) -> dict:
        """The episode's result; under `requeue`, each published version re-checks its staleness
        (the driver-side watchdog: raises StaleEpisode)."""
        while requeue and not fut.done():
            published = self._versions.wait()
            try:
                await asyncio.wait({fut, published}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                published.cancel()
            if not fut.done():
                await slot.before_turn()
        await asyncio.wait({fut})  # not `await fut`: a cancellation must leave it running, to be killed
        return fut.result()

    def wait_ready(self, timeout: float = 300.0) -> list[int]:
        """Block until every actor is placed and built (so start-up is not charged to the first
        episodes' timeouts); returns their pids. A worker not placed in time is an error naming
        the resources it asked for."""
        ray = _ray()
        refs = [w.ping for w in self.workers]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            late = [self._resources(w.index) for w in self.workers if w.ping in pending]
            raise RuntimeError(f"ray: {len(pending)} of {len(refs)} episode workers were not placed within {timeout:g} s "
                               f"(resources {late}, num_cpus {self.config.num_cpus_per_worker:g} each): "
                               "does a live node have them?")
        return [where["pid"] for where in ray.get(refs)]

    def shutdown(self) -> None:
        """Every worker's warm pool closed (those still up), then every actor killed."""
        ray = _ray()
        up = [w for w in self.workers if w.up]
        try:
            built, _ = ray.wait([w.ping for w in up], num_returns=len(up), timeout=0)
            closing = [w.actor.close.remote() for w in up if any(w.ping == b for b in built)]
            ray.wait(closing, num_returns=len(closing), timeout=60)
        except Exception:  # noqa: BLE001 - a worker that died takes its sandboxes to the reaper
            pass
        for w in self.workers:
            with contextlib.suppress(Exception):  # already gone with its node
                ray.kill(w.actor)
        self.workers = []


class RayRun:
    """The "ray" placement of `harnessrl train` (`gym.placement`): `RolloutWorker`s on Ray actors."""

    episodes_here = False
    """Episodes run on the workers: the driver starts no warm pool."""

    def __init__(self, config: RayPlacementConfig):
        self.config = config
        self.episodes_fn: RayEpisodes | None = None
        self._started_ray, self._ip = False, ""

    @classmethod
    def for_run(cls, run_config: Any) -> "RayRun":
        return cls(run_config.ray)

    def start(self) -> dict[str, Any]:
        """Join (or start) the cluster; the proxy fields that let workers reach the run's proxy."""
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.config.address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            self._started_ray = True
        self._ip = ray.util.get_node_ip_address()
        return {"host": self.config.proxy_host or self._ip, "admin_clients": "any"}

    def episodes(self, rollout: Any, config: Any) -> RayEpisodes:
        """The episode function over `rollout`'s proxy (started) and tasks; `config`: the
        workers' `RolloutConfig` (their warm pools: its `sandbox_pool_size`)."""
        from harnessrl.gym.proxy_admin import ProxyHandle

        handle = ProxyHandle.of(rollout.proxy, url=rollout.proxy.url.replace("://0.0.0.0:", f"://{self._ip}:"))
        factory = functools.partial(RolloutWorker, config, handle, list(rollout.tasks.values()), socket.gethostname())
        self.episodes_fn = RayEpisodes(factory, self.config)
        self.episodes_fn.wait_ready(self.config.ready_timeout_s)
        return self.episodes_fn

    async def publish(self, version: int) -> None:
        if self.episodes_fn is not None:
            await self.episodes_fn.publish(version)

    def close(self) -> None:
        if self.episodes_fn is not None:
            self.episodes_fn.shutdown()
            self.episodes_fn = None
        if self._started_ray:
            _ray().shutdown()
            self._started_ray = False


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
