"""One composition: the episode stack built in one place, and one call that publishes a version.

Contract:
- `EpisodeStack(cfg)` is what every episode of a run shares, from one `RolloutConfig`: its tasks
  (`load_suite_tasks`, loaded on first use, or handed in so a run loads its suite once; tasks
  rewarded by a judge are refused there when the run configures no judge), the
  harness adapters (one per harness of `harness_weights`, by the adapter's name; `adapter` is
  `cfg.harness`'s), the sandbox backend (or an external one handed in) and, with
  `sandbox_pool_size` > 0 or a pool handed in, the warm pool episodes lease from.
  `stack.proxy(...)` builds (does not start) a proxy for these settings in front of an engine URL
  or an external `GenerationBackend` (a trainer's own generate call, the gym env's bridge, a
  bench's policy); `ProxyHandle.of(proxy)` is how an episode reaches it. `stack.run(task,
  handle, harness=)` is one episode (`gym.episode.run_episode`) on these pieces, through the
  named harness (default: `cfg.harness`). Nothing here starts an
  engine: the composition root does.
- `proxy_config(cfg, ...)` is the one mapping from a run's settings to the proxy's config (the
  sampling policy, the token limits, the engine-call timeouts); callers change only the fields
  the run's settings do not carry.
- `Publisher(scheduler, proxy, sync, workers).push(trainer)` publishes new weights in the one
  order that keeps the staleness checks sound: the engine first (the weight sync pauses the
  proxy's admission and the engine, loads the weights under the new version, resumes both),
  then the scheduler (episodes admitted from now on start at it; η counts from it), then the
  proxy (its per-turn check refuses turns of episodes now too old), then the workers where
  episodes run (`gym.placement`: Ray workers get it pushed). `publish(version)` is the last
  three alone (a version whose weights the engine already serves).
- `in_thread(fn, *args)` and `cancellable(run, reason)`: a blocking episode in a thread of its
  own, and its release when the awaiting task is cancelled.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from harnessrl.adapters.cancel import Cancel

if TYPE_CHECKING:
    from harnessrl.gym.episode import EpisodeConfig, EpisodeResult, ProxyHandle
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.tasks import Task

T = TypeVar("T")


def load_suite_tasks(cfg: "RolloutConfig") -> list:
    """The tasks a run of `cfg` draws from: its suite, narrowed to `tasks` and `difficulties`,
    every one with its sources; a ValueError names what matched nothing."""
    from harnessrl.gym.tasks import TaskFileError
    from harnessrl.gym.tasks.loaders import load_suite, require_sources

    tasks = load_suite(cfg.suite, source_root=cfg.source_root)
    if cfg.tasks is not None:
        known = {t.instance_id for t in tasks}
        missing = [t for t in cfg.tasks if t not in known]
        if missing:
            raise ValueError(f"tasks: {missing} not in suite {cfg.suite!r}")
        tasks = [t for t in tasks if t.instance_id in set(cfg.tasks)]
    if cfg.difficulties is not None:
        tasks = [t for t in tasks if t.difficulty in cfg.difficulties]
    if not tasks:
        raise ValueError(f"suite {cfg.suite!r} has no task matching tasks={cfg.tasks} difficulties={cfg.difficulties}")
    require_sources(tasks)
    judged = [t.instance_id for t in tasks if t.reward_kind().needs_judge()]
    if judged and cfg.episode.reward.judge is None:  # else every such episode would be masked
        raise TaskFileError(f"rollout.episode.reward.judge: tasks {judged[:5]}{' ...' if len(judged) > 5 else ''} are "
                         "rewarded by a judge, and no judge is configured (base_url, model, api_key_env)")
    return tasks


def proxy_config(cfg: "RolloutConfig", engine_url: str | list[str] = "", out_dir: str | Path | None = None,
                 **fields: Any) -> "ProxyConfig":
    """The proxy of a run of `cfg` in front of `engine_url` ("" when a backend object generates);
    with `out_dir` its store and unix socket live there. `fields`: other `ProxyConfig` fields
    (a bridge's numbered stores, check-adapter's token limits)."""
    from harnessrl.gym.proxy.config import ProxyConfig

    where = {} if out_dir is None else {"db_path": str(Path(out_dir) / "trajectories.db"),
                                        "uds_path": str(Path(out_dir) / "proxy.sock")}
    return ProxyConfig(**{
        "engine_url": engine_url, "backend": cfg.backend, "vllm_route": cfg.vllm_route, "model": cfg.model,
        "served_models": [cfg.served_model_name], "sampling_policy": cfg.sampling_policy,
        "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
        "default_max_tokens": cfg.max_new_tokens, "max_tokens_cap": cfg.max_new_tokens,
        "engine_total_timeout_s": cfg.engine_timeout_s,
        "engine_first_byte_timeout_s": min(cfg.engine_timeout_s, 300.0), **where, **fields})


class EpisodeStack:
    """Tasks + harness adapter + sandbox source of one run, and the proxies its episodes reach
    (module doc). `tasks`: the run's tasks, loaded once by the caller (None: the suite of `cfg`,
    on first use); `adapter`: an adapter object instead of `cfg.harness`; `sandbox_backend`: a
    backend object instead of `cfg.sandbox`; `sandboxes`: a warm pool made ahead
    (`rollout.prewarmed_sandboxes`), whose backend is then the stack's."""

    def __init__(self, cfg: "RolloutConfig", *, tasks: list["Task"] | None = None, adapter: Any = None,
                 sandbox_backend: Any = None, sandboxes: Any = None):
        from harnessrl.adapters import get_adapter

        self.cfg = cfg
        self._tasks = None if tasks is None else {t.instance_id: t for t in tasks}
        if adapter is not None:
            self.adapter, weights = adapter, {adapter.name: 1.0}
            self.adapters: dict[str, Any] = {adapter.name: adapter}
        else:
            made = {key: get_adapter(key, **cfg.harness_options.get(key, {})) for key in cfg.harness_weights}
            self.adapter = made[cfg.harness]
            self.adapters = {}
            for key, a in made.items():
                if a.name in self.adapters:
                    raise ValueError(f"rollout.harnesses: {key!r} is harness {a.name!r} again; a run's harnesses "
                                     "must differ by name (their figures are kept by it)")
                self.adapters[a.name] = a
            weights = {made[k].name: w for k, w in cfg.harness_weights.items()}
        self.harness_weights: dict[str, float] = weights
        """Each harness's weight, by its adapter's name (the name its trajectories carry)."""
        if sandboxes is not None:
            self.backend = sandboxes.pool.backend
        elif sandbox_backend is not None:
            self.backend = sandbox_backend
        else:
            from harnessrl.sandboxes import make_backend

            self.backend = make_backend(cfg.sandbox, {"docker": cfg.docker} if cfg.docker else None)
        self.sandboxes = sandboxes
        """The warm pool episodes lease from (None: a fresh sandbox per episode)."""
        if sandboxes is None and cfg.sandbox_pool_size:
            from harnessrl.gym.sandbox_source import PooledSandboxes

            self.sandboxes = PooledSandboxes(self.backend, cfg.sandbox_pool_size)

    @property
    def tasks(self) -> dict[str, "Task"]:
        """The run's tasks by instance id (the one dict: adding to it adds a task to the run)."""
        if self._tasks is None:
            self._tasks = {t.instance_id: t for t in load_suite_tasks(self.cfg)}
        return self._tasks

    def proxy(self, engine_url: str | list[str] = "", out_dir: str | Path | None = None, generation_backend: Any = None,
              tokenizer: Any = None, **fields: Any) -> "ProxyServer":
        """A proxy (not started) for this run's settings (`proxy_config`), generating through
        `generation_backend` when given, else the engine at `engine_url`."""
        from harnessrl.gym.proxy.server import ProxyServer

        return ProxyServer(proxy_config(self.cfg, engine_url, out_dir, **fields), tokenizer, backend=generation_backend)

    def make_sandbox(self, spec: Any, mounts: Any) -> Any:
        """A fresh sandbox on the stack's backend (for an episode that does not lease one)."""
        return self.backend.create(spec, mounts)

    def prewarm(self, task_ids: Any, harnesses: Any = None) -> None:
        """Start the pool's sandboxes for these tasks' repositories in the background, each for
        the harness beside it in `harnesses` (None: `adapter` for every one)."""
        if self.sandboxes is None:
            return
        task_ids = list(task_ids)
        names = list(harnesses) if harnesses is not None else [self.adapter.name] * len(task_ids)
        for spec, name in dict.fromkeys((self.tasks[t].repo_spec(), n) for t, n in zip(task_ids, names)):
            self.sandboxes.prewarm(spec, self.adapters[name])

    def adapter_for(self, harness: str | None) -> Any:
        """The adapter of a harness of this run by name (None: `adapter`); a KeyError lists them."""
        if harness is None:
            return self.adapter
        try:
            return self.adapters[harness]
        except KeyError:
            raise KeyError(f"harness {harness!r} is not one of this run's: {sorted(self.adapters)}") from None

    def run(self, task: "Task | str", handle: "ProxyHandle", *, episode: "EpisodeConfig | None" = None,
            session_meta: dict[str, Any] | None = None, cancel: Cancel | None = None,
            sandboxes: Any = None, harness: str | None = None) -> "EpisodeResult":
        """One episode of `task` (an object, or an id among `tasks`) through the proxy of `handle`,
        blocking. `episode`: limits other than the run's; `sandboxes`: a factory or source other
        than the stack's (its pool, else a fresh sandbox each); `harness`: which of the run's
        harnesses (None: `adapter`)."""
        from harnessrl.gym.episode import run_episode

        if isinstance(task, str):
            task = self.tasks[task]
        return run_episode(task, self.adapter_for(harness), sandboxes or self.sandboxes or self.make_sandbox, handle,
                           self.cfg.served_model_name, episode or self.cfg.episode, session_meta=session_meta,
                           cancel=cancel)

    def close(self) -> None:
        """The warm pool's idle sandboxes closed (held ones close when released)."""
        if self.sandboxes is not None:
            self.sandboxes.close()


class Publisher:
    """Publishes policy versions to the engine, the scheduler, the proxy and the workers, in
    that module doc's order. `proxy`: the run's `ProxyServer`, or its `ProxyFleet` when several
    proxies serve it (`gym.proxies`: each told in turn; None: no proxy to tell); `sync`:
    the weight sync that loads a trainer's weights into the engine (`push(trainer) -> version`);
    its gate becomes the proxy when it has none; `workers`: where episodes run, told last
    (anything with an async `publish(version)`: a `gym.placement` placement, `RayEpisodes`)."""

    def __init__(self, scheduler: Any, proxy: Any = None, sync: Any = None, workers: Any = None):
        self.scheduler, self.proxy, self.sync, self.workers = scheduler, proxy, sync, workers
        if sync is not None and proxy is not None and getattr(sync, "gate", False) is None:
            sync.gate = proxy  # weight updates pause proxy admission too

    async def publish(self, version: int) -> int:
        """The engine already serves `version`: the scheduler, the proxy, then the workers move to it."""
        await self.scheduler.advance_version(version)
        if self.proxy is not None:
            self.proxy.set_policy_version(self.scheduler.version)
        if self.workers is not None:
            await self.workers.publish(self.scheduler.version)
        return self.scheduler.version

    async def push(self, trainer: Any, advance: bool = True) -> int:
        """The trainer's weights into the engine under its new version, then `publish` it;
        `advance` False: the engine alone (a run's last push, after which nothing is admitted).
        Returns the version."""
        if self.sync is None:
            raise RuntimeError("Publisher.push: no weight sync to load the trainer's weights with")
        version = await self.sync.push(trainer)
        return await self.publish(version) if advance else version


def in_thread(fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
    """`fn(*args)` in a thread of its own, as a future of this loop. Not `asyncio.to_thread`:
    the loop's default executor has min(32, cores + 4) workers, which would silently cap the
    env pool (6 episodes on 2 cores) and queue a cancelled episode's release behind running
    episodes. Cancelling the future does not stop the thread (that is what `Cancel` is for)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def target() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(*args), None)
        except BaseException as e:  # handed to the awaiting task, whatever it is
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for this any more
            pass

    threading.Thread(target=target, name=f"harnessrl-{getattr(fn, '__name__', 'thread')}", daemon=True).start()
    return fut


async def cancellable(run: Callable[[Cancel], T], reason: str, wait_s: float = 120.0) -> T:
    """`run(cancel)` (a blocking episode) in a thread of its own; cancelled, it sets the
    episode's `Cancel` with `reason` (harness tree killed, sandbox closed) and waits up to
    `wait_s` for the thread to end before the cancellation goes on: an abandoned episode holds
    nothing afterwards."""
    cancel = Cancel()
    thread = in_thread(run, cancel)
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError:
        await asyncio.shield(in_thread(cancel.set, reason))
        await asyncio.wait({thread}, timeout=wait_s)
        if thread.done() and not thread.cancelled():
            thread.exception()  # what the abandoned run raised is moot: taken, so asyncio logs no traceback
        raise
