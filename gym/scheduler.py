"""Rollout scheduling with bounded, visible staleness.

Contract: episodes run concurrently, up to `env_pool_size`, each with its own timeout; the
trainer takes complete GRPO groups as they finish while new episodes start. `staleness`
(η) bounds how many policy versions a trained token may lag the policy being updated:
a batch consumed at version V holds only tokens sampled by versions >= V - η.

Three mechanisms keep η:

- Admission (AReaL-style): a new group starts only while fewer than
  `(η + 1) * groups_per_step` started groups are outside the batches the trainer is done
  with, so the generator never runs further ahead than the trainer can consume in time
  (`admission_slack` batches more, for a held trainer: below). A batch is done with when the
  trainer publishes the next version or, if its step updated nothing (every episode masked),
  asks for the next batch; so η = 0 stays synchronous. With one version per batch of
  `groups_per_step` groups this is AReaL's `groups_started < (V + η + 1) * groups_per_step`;
  counted against V instead, a batch that updated nothing (no new version) or a `wait` batch
  above `groups_per_step` shrank the window for the rest of the run, and at η = 0 one batch
  without an update stalled the run.
- A per-turn check: an episode calls `slot.before_turn()` before each model call; under the
  `requeue` policy an episode whose oldest token would already be too stale is aborted
  (`StaleEpisode`) and its task rerun. Harness episodes make their calls through the proxy,
  so the proxy runs the same check per call (`slot.staleness_limit`, see `gym.rollout`).
- At consumption: under `wait` the trainer at version V first waits for every in-flight
  group that started at a version <= V - η and takes it into this batch (after the update it
  would be too stale); under `requeue` a too-stale group is dropped and its task rerun;
  under `downweight` it is kept, its weight multiplied by `downweight_factor ** excess`;
  under `mask` it is kept and only its tokens sampled by versions older than V - η are
  masked out of the loss (their version and logprob cleared), so no trainer ever waits and
  every trained token is within η; the masked-token count is reported. `wait` with
  `max_wait_s` is between the two: the trainer holds its batch at most that long for the
  stale-prone groups (taking those that finish meanwhile), then goes on, and a group it left
  is masked like `mask`'s when it is consumed.

Every episode ends in exactly one record of its group, or a rerun, whatever raises where:
its slot is freed by a done callback of its task, so no failure holds a slot or leaves a
group incomplete. A timeout gives a masked `timeout` record (the episode function is
cancelled and should release its sandbox and harness before it lets that through:
`Rollout.episode` does); `StaleEpisode` a rerun; any other exception (BaseExceptions
included, except KeyboardInterrupt and SystemExit, which stop the run) a masked
`infra_error` / `infra` record whose `metadata["error"]` names it; so does a result that is
not a `Trajectory`. A launch loop that dies (e.g. the task iterator raised) makes
`next_batch` raise instead of wait.

Several harnesses: with a `harness_for` callable (`gym.harness_mix.HarnessMix`) each new group
draws its harness once; every episode of the group gets it as `slot.harness`, a requeued
group's rerun keeps it, and the records the scheduler writes itself (timeout, infra, stale)
carry it as their `harness`.

η = 0 with `wait` is the synchronous baseline: one version per step, the trainer waits for
every episode of the step. The counts of each policy's interventions are in `stats`.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Literal

from pydantic import BaseModel, Field, model_validator

from harnessrl.gym.failures import describe
from harnessrl.gym.trajectory import Trajectory


class SchedulerConfig(BaseModel, extra="forbid", use_attribute_docstrings=True):
    """How episodes are scheduled against the trainer."""

    env_pool_size: int = Field(8, ge=1)
    """Most episodes (sandbox + harness) running at once."""
    group_size: int = Field(4, ge=1)
    """G: rollouts of the same task whose rewards form one GRPO group."""
    groups_per_step: int = Field(2, ge=1)
    """Groups the trainer consumes per step (at least; `wait` may add stale-prone ones)."""
    staleness: int = Field(1, ge=0)
    """η: the most policy versions a trained token may lag. 0 = synchronous."""
    over_staleness: Literal["wait", "requeue", "downweight", "mask"] = "wait"
    """What to do with data that would exceed η: make the trainer wait for it, abort and
    rerun it, keep it with a lower weight (the only policy that lets η be exceeded), or keep
    it with its too-old tokens masked out of the loss."""
    max_wait_s: float | None = Field(None, ge=0)
    """Under `wait`: the longest the trainer holds a batch it already has (`groups_per_step`
    complete groups) for the stale-prone groups still running; None: however long they take.
    Past it the batch goes without them and they are taken later under `mask`'s rule (their
    tokens older than V - η masked), so η still holds and a straggler costs its own oldest
    tokens rather than the pool's episodes. A stale-prone group that finishes within the hold
    joins the batch (which then holds more than `groups_per_step`, as under `wait`)."""
    admission_slack: int = Field(0, ge=0)
    """Batches of groups admission lets start beyond the η rule: a group starts while
    `groups_started - groups_done < (η + 1 + admission_slack) * groups_per_step` (the groups of
    the batches the trainer is done with: see the module doc). η is still kept at
    consumption (`wait`, `mask` and `requeue` hold it there; `downweight` lets it be exceeded):
    the slack keeps the env pool full while the trainer holds a batch (`max_wait_s`)."""
    downweight_factor: float = Field(0.5, gt=0, le=1)
    """Weight multiplier per version of excess staleness, for `downweight`."""
    episode_timeout_s: float = Field(3600.0, gt=0)
    """Wall-clock limit of one episode, a backstop: past it the episode ends `timeout` and is
    masked, so it must leave the harness's wall time plus scoring's worst case (`harnessrl
    train` checks this: `RewardConfig.worst_case_s`); the harness's own limit is what scores."""
    max_requeues: int = Field(3, ge=0)
    """How often one task's rollout may be rerun for staleness before it is dropped."""

    @model_validator(mode="after")
    def _hold_needs_wait(self) -> "SchedulerConfig":
        if self.max_wait_s is not None and self.over_staleness != "wait":
            raise ValueError(f"max_wait_s bounds the `wait` policy's hold; over_staleness is "
                             f"{self.over_staleness!r}, which never holds the trainer (unset max_wait_s)")
        return self


class StaleEpisode(Exception):
    """Raised by `before_turn` when the episode's data could no longer be trained on."""


class _EpisodeRaised(Exception):
    """Carries a TimeoutError the episode raised itself, so it is not taken for the episode timeout."""


@dataclass
class EpisodeSlot:
    """What an episode gets: its identity and the per-turn staleness check."""

    task_id: str
    group_id: int
    index: int
    start_version: int
    attempt: int
    _sched: "RolloutScheduler" = field(repr=False)
    harness: str | None = None
    """The harness of this episode's group (None: the run's one harness)."""

    @property
    def version(self) -> int:
        return self._sched.version

    @property
    def staleness_limit(self) -> int | None:
        """η when the per-turn check may abort this episode (`requeue`), else None. An episode
        whose turns happen elsewhere (a harness behind the proxy) hands it to the proxy as the
        session's `staleness_limit`; the proxy then refuses the turn that would exceed it."""
        c = self._sched.config
        return c.staleness if c.over_staleness == "requeue" else None

    async def before_turn(self) -> int:
        """Call before each model call; returns the current version, or raises StaleEpisode."""
        s = self._sched
        if s.config.over_staleness == "requeue" and s.version - self.start_version > s.config.staleness:
            raise StaleEpisode(f"started at v{self.start_version}, policy now v{s.version}")
        return s.version


EpisodeFn = Callable[[EpisodeSlot], Awaitable[Trajectory]]


def session_meta(start_version: int, staleness_limit: int | None, group_id: int | None = None) -> dict:
    """What a harness episode's proxy session carries for the scheduler: its start version and
    group (the engine priority: oldest group first, the order `next_batch` consumes groups in)
    and, under `requeue`, the η the proxy's per-turn check enforces."""
    meta: dict = {"start_version": start_version}
    if group_id is not None:
        meta["group_id"] = group_id
    if staleness_limit is not None:
        meta["staleness_limit"] = staleness_limit
    return meta


def raise_if_aborted_stale(traj: Trajectory, staleness_limit: int | None) -> Trajectory:
    """The proxy's per-turn check ended this episode `stale`: raise StaleEpisode (rerun it)."""
    if traj.termination == "stale":
        raise StaleEpisode(f"the proxy aborted session {traj.session_id}: its data exceeded η={staleness_limit}")
    return traj


@dataclass(eq=False)
class _Group:
    group_id: int
    task_id: str
    start_version: int
    harness: str | None = None
    trajectories: dict[int, Trajectory] = field(default_factory=dict)
    running: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class SchedulerStats:
    started: int = 0
    completed: int = 0
    timeouts: int = 0
    errors: int = 0
    """Episodes that raised an unexpected exception (recorded as masked `infra_error`)."""
    requeued_turn: int = 0
    requeued_group: int = 0
    dropped: int = 0
    downweighted: int = 0
    masked_tokens: int = 0
    """Sampled tokens masked out of the loss for exceeding η (`mask`, or `wait` past `max_wait_s`)."""
    trained_tokens: int = 0
    waited_groups: int = 0
    wait_s: float = 0.0
    wait_timeouts: int = 0
    """Batches that went without stale-prone groups after `max_wait_s`."""
    staleness_hist: dict[int, int] = field(default_factory=dict)
    """Trained tokens by lag (consumption version minus sampling version)."""
    env_latency_s: list[float] = field(default_factory=list)
    consumed: int = 0

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "env_latency_s"}


def token_versions(traj: Trajectory) -> list[int]:
    return [v for seg in traj.segments for v, m in zip(seg.versions, seg.loss_mask) if m]


class RolloutScheduler:
    """Runs episodes against a moving policy version; hands the trainer complete groups."""

    def __init__(self, config: SchedulerConfig, episode_fn: EpisodeFn, tasks: Iterable[str],
                 harness_for: Callable[[], str] | None = None):
        """`harness_for`: draws the harness of each new group (None: one harness, the episode's own)."""
        self.config = config
        self._harness_for = harness_for
        self._episode_fn = episode_fn
        self._tasks = iter(tasks)  # pass itertools.cycle(...) for an endless run
        self.version = 0
        self.stats = SchedulerStats()
        self._groups: dict[int, _Group] = {}
        self._ready: deque[_Group] = deque()
        self._retry: deque[tuple[_Group, int, int]] = deque()  # (group, index, attempt)
        self._pending: deque[tuple[_Group, int]] = deque()  # episodes of admitted groups not yet launched
        self._groups_started = 0
        self._groups_consumed = 0  # taken into batches (a requeued group's rerun is the same group here)
        self._groups_done = 0  # of those, in batches the trainer is done with: what admission counts
        self._free = config.env_pool_size
        self._cond = asyncio.Condition()
        self._runner: asyncio.Task | None = None
        self._episodes: set[asyncio.Task] = set()
        self._group_ids = itertools.count()
        self._exhausted = False
        self._closing = False
        self._failure: BaseException | None = None
        """What killed the launch loop (next_batch raises it rather than wait forever)."""
        self._notifiers: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._runner = asyncio.create_task(self._launch_loop())
        self._runner.add_done_callback(self._runner_done)

    async def close(self) -> None:
        self._closing = True
        if self._runner:
            self._runner.cancel()
        for t in list(self._episodes):
            t.cancel()
        await asyncio.gather(*self._episodes, *( [self._runner] if self._runner else []), return_exceptions=True)

    async def advance_version(self, version: int | None = None) -> None:
        """The trainer published new weights: later tokens carry this version."""
        async with self._cond:
            self.version = self.version + 1 if version is None else version
            self._groups_done = self._groups_consumed  # the batches before this version are done with
            self._cond.notify_all()

    # -- admission and launching -------------------------------------------------------
    def _admissible(self) -> bool:
        c = self.config
        return self._groups_started - self._groups_done < (c.staleness + 1 + c.admission_slack) * c.groups_per_step

    async def _launch_loop(self) -> None:
        while True:
            async with self._cond:
                await self._cond.wait_for(self._can_launch)
                item = self._next_episode()
                if item is None:
                    continue
                group, index, attempt = item
                self._free -= 1
                group.running += 1
                slot = EpisodeSlot(group.task_id, group.group_id, index, self.version, attempt, self, group.harness)
                self.stats.started += 1
            task = asyncio.create_task(self._run_episode(slot))
            self._episodes.add(task)
            task.add_done_callback(functools.partial(self._settle, group, slot, time.monotonic()))

    def _can_launch(self) -> bool:
        if self._free <= 0:
            return False
        return bool(self._retry or self._pending) or (not self._exhausted and self._admissible())

    def _next_episode(self) -> tuple[_Group, int, int] | None:
        if self._retry:
            return self._retry.popleft()
        if not self._pending:
            try:
                task_id = next(self._tasks)
            except StopIteration:
                self._exhausted = True
                return None
            gid = next(self._group_ids)
            group = _Group(gid, task_id, self.version, self._harness_for() if self._harness_for else None)
            self._groups[gid] = group
            self._groups_started += 1
            self._pending.extend((group, i) for i in range(self.config.group_size))
        group, index = self._pending.popleft()
        return group, index, 0

    async def _run_episode(self, slot: EpisodeSlot) -> Trajectory:
        """The episode under its timeout; a TimeoutError out of here is the scheduler's own."""
        return await asyncio.wait_for(self._guarded(slot), self.config.episode_timeout_s)

    async def _guarded(self, slot: EpisodeSlot) -> Trajectory:
        try:
            return await self._episode_fn(slot)
        except (TimeoutError, asyncio.TimeoutError) as e:  # the episode's own, not the episode timeout
            raise _EpisodeRaised(e) from e

    def _settle(self, group: _Group, slot: EpisodeSlot, t0: float, task: asyncio.Task) -> None:
        """The episode's end, however it came (a done callback, so it runs whatever raised
        where): its slot is freed and its group gets exactly one record, or a rerun."""
        self._episodes.discard(task)
        self._free += 1
        group.running -= 1
        try:
            traj = self._record(group, slot, task)
            if traj is not None:
                traj.metadata.setdefault("start_version", slot.start_version)
        except Exception as e:  # noqa: BLE001 - the bookkeeping itself failed: still one record
            traj = self._failed(group, slot, f"scheduler bookkeeping: {describe(e)}")
        if traj is not None:
            self.stats.completed += 1
            self.stats.env_latency_s.append(time.monotonic() - t0)
            group.trajectories[slot.index] = traj
        if len(group.trajectories) == self.config.group_size and not group.done.is_set():
            group.done.set()
            self._ready.append(group)
        self._kick()

    def _record(self, group: _Group, slot: EpisodeSlot, task: asyncio.Task) -> Trajectory | None:
        """The record the episode's task ended with; None when there is none to keep (a
        rerun, a shutdown, a stop signal)."""
        if task.cancelled():
            if self._closing:
                return None  # shutting down: nothing more is consumed
            return self._failed(group, slot, "CancelledError: the episode cancelled itself")
        exc = task.exception()
        if exc is None:
            traj = task.result()
            if isinstance(traj, Trajectory):
                return traj
            return self._failed(group, slot, f"TypeError: the episode returned {type(traj).__name__}, "
                                             "not a Trajectory")
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return None  # the run is stopping: it propagates out of the event loop
        if isinstance(exc, StaleEpisode):
            self.stats.requeued_turn += 1
            if slot.attempt < self.config.max_requeues:
                self._retry.append((group, slot.index, slot.attempt + 1))
                return None
            self.stats.dropped += 1
            return Trajectory(session_id=f"g{group.group_id}-{slot.index}", segments=[], status="infra_error",
                              termination="stale", task_id=group.task_id, harness=group.harness or "")
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            self.stats.timeouts += 1
            traj = Trajectory(session_id=f"g{group.group_id}-{slot.index}", segments=[], status="truncated",
                              termination="timeout", task_id=group.task_id, harness=group.harness or "")
            traj.metadata.update({"masked": True, "error": f"episode timeout ({self.config.episode_timeout_s:g} s)"})
            return traj
        raised = exc.__cause__ if isinstance(exc, _EpisodeRaised) else exc
        return self._failed(group, slot, describe(raised))

    def _failed(self, group: _Group, slot: EpisodeSlot, error: str) -> Trajectory:
        """The record of an episode that raised: masked (`infra_error`), the exception named."""
        self.stats.errors += 1
        traj = Trajectory(session_id=f"g{group.group_id}-{slot.index}", segments=[], status="infra_error",
                          termination="infra", task_id=group.task_id, harness=group.harness or "")
        traj.metadata.update({"masked": True, "error": error, "start_version": slot.start_version})
        return traj

    def _kick(self) -> None:
        """Wake whoever waits on the condition (from a callback, which cannot take its lock)."""
        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        t = asyncio.get_running_loop().create_task(notify())
        self._notifiers.add(t)
        t.add_done_callback(self._notifiers.discard)

    def _runner_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()
            self._kick()

    # -- consumption -------------------------------------------------------------------
    def _group_min_version(self, group: _Group) -> int:
        versions = [v for t in group.trajectories.values() for v in token_versions(t)]
        return min(versions) if versions else group.start_version

    async def next_batch(self) -> list[Trajectory]:
        """Complete groups for a training step at the current version, η enforced."""
        c = self.config
        V = self.version
        t0 = time.monotonic()
        batch: list[_Group] = []
        deadline: float | None = None  # `max_wait_s` from the moment the batch is full
        async with self._cond:
            if self._groups_done < self._groups_consumed:  # the last step updated nothing: no new version
                self._groups_done = self._groups_consumed
                self._cond.notify_all()
            while True:
                if self._failure is not None:
                    failure = self._failure
                    raise RuntimeError(f"the scheduler's launch loop failed: {describe(failure)}") from failure
                # Under `wait`, every group that started at <= V - η must be in this batch.
                must = [g for g in self._groups.values()
                        if c.over_staleness == "wait" and g.start_version <= V - c.staleness and g not in batch]
                # Oldest first: the groups closest to the staleness bound go into this batch.
                for group in sorted(self._ready, key=lambda g: (g.start_version, g.group_id)):
                    if len(batch) < c.groups_per_step or group in must:
                        self._ready.remove(group)
                        if self._accept(group, V):
                            batch.append(group)
                must = [g for g in must if g not in batch and g.group_id in self._groups]
                if len(batch) >= c.groups_per_step and not must:
                    break
                if len(batch) >= c.groups_per_step and c.max_wait_s is not None:
                    now = time.monotonic()
                    deadline = now + c.max_wait_s if deadline is None else deadline
                    if now >= deadline:
                        self.stats.wait_timeouts += 1
                        break
                    self.stats.waited_groups += 1
                    try:
                        await asyncio.wait_for(self._cond.wait(), deadline - now)
                    except TimeoutError:
                        pass  # the condition's lock is held again either way
                    continue
                if self._exhausted and not self._episodes and not self._ready and not self._pending and not self._retry:
                    break
                if must:
                    self.stats.waited_groups += 1
                await self._cond.wait()
        for g in batch:
            del self._groups[g.group_id]
        self._groups_consumed += len(batch)
        self.stats.wait_s += time.monotonic() - t0
        out: list[Trajectory] = []
        for g in batch:
            for i in sorted(g.trajectories):
                traj = g.trajectories[i]
                for v in token_versions(traj):
                    self.stats.trained_tokens += 1
                    lag = V - v
                    self.stats.staleness_hist[lag] = self.stats.staleness_hist.get(lag, 0) + 1
                traj.metadata["group_id"] = g.group_id
                if g.harness is not None:
                    traj.metadata["group_harness"] = g.harness
                traj.metadata["consumed_at_version"] = V
                out.append(traj)
        self.stats.consumed += len(out)
        return out

    def _accept(self, group: _Group, V: int) -> bool:
        c = self.config
        excess = V - self._group_min_version(group) - c.staleness
        if excess <= 0:
            return True
        if c.over_staleness == "mask" or (c.over_staleness == "wait" and c.max_wait_s is not None):
            for t in group.trajectories.values():
                for seg in t.segments:
                    for i, (m, v) in enumerate(zip(seg.loss_mask, seg.versions)):
                        if m and v < V - c.staleness:
                            seg.loss_mask[i], seg.versions[i], seg.logprobs[i] = 0, -1, 0.0
                            self.stats.masked_tokens += 1
            return True
        if c.over_staleness == "downweight":
            self.stats.downweighted += 1
            for t in group.trajectories.values():
                t.metadata["weight"] = t.metadata.get("weight", 1.0) * c.downweight_factor ** excess
            return True
        # `requeue` (or `wait` defeated by a version jump): drop the data, rerun the task.
        self.stats.requeued_group += 1
        del self._groups[group.group_id]
        fresh = _Group(next(self._group_ids), group.task_id, V, group.harness)
        self._groups[fresh.group_id] = fresh
        self._pending.extendleft((fresh, i) for i in reversed(range(c.group_size)))
        self._cond.notify_all()
        return False
