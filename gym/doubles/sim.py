"""A simulated generator and environment, for sizing env pools and testing the scheduler.

`SimEngine` models a batching engine: `slots` sequences decode together, one token each per
step. By default a step takes `step_s` whatever the batch size (the GPU regime, where a small
batch's step reads the weights once and its rows cost next to nothing); `row_cost` > 0 makes
each row beyond the first add that fraction of `step_s` (the CPU regime: a local engine on one
CPU thread pays for every row's head product, attention and sampling; `step_time`). An episode alternates a generation of
`tokens_per_turn` tokens with an environment wait drawn from a latency distribution. Each
sampled token carries the policy version current when it was decoded. With `priority` on,
a free slot goes to the waiting request with the best priority (the proxy's
earliest-deadline priority: the oldest episode first), else to the first come. A running
request keeps its slot until it finishes, as in the local engine, and in SGLang, whose
priority preemption needs a gap (default 10) far wider than our version priorities.

It speaks no wire contract and models no token ids: `SimEngine.generate` returns only the
policy version of each decoded token (all the scheduler reads), in-process, so there is no
SGLang reply to encode; simulated episodes build real `Trajectory` records.

The staleness bound both async benches read (the simulation's `bench/async_vs_sync.py` and the
real stack's `bench/async_real.py`) is here once: Little's law (`saturating_episodes`,
`occupancy_bound`), the scheduler's admission (`admitted`), and the figures of a run of batches
(`in_flight`, `max_lag`, `steady_start`, `steady_rate`).
"""
from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from harnessrl.gym.scheduler import EpisodeSlot, token_versions
from harnessrl.gym.trajectory import Segment, Trajectory


# -- the staleness bound: Little's law for episodes that alternate generation and environment ----
def saturating_episodes(slots: int, t_gen: float, t_env: float) -> float:
    """N*: the episodes in flight that keep `slots` decode slots busy, when an episode spends
    `t_gen` at the engine for every `t_env` outside it: slots * (t_gen + t_env) / t_gen."""
    return slots * (t_gen + t_env) / t_gen


def admitted(pool: int, staleness: int, admission_slack: int, batch: int) -> int:
    """Episodes the scheduler lets run at once under staleness η: the env pool, or the
    (η + 1 + slack) batches its admission allows, whichever is smaller."""
    return min(pool, (staleness + 1 + admission_slack) * batch)


def occupancy_bound(in_flight: float, slots: int, t_gen: float, t_env: float) -> float:
    """The engine occupancy `in_flight` such episodes can reach at most:
    min(1, N * t_gen / (slots * (t_gen + t_env)))."""
    return min(1.0, in_flight * t_gen / (slots * (t_gen + t_env)))


def in_flight(stats) -> int:
    """Episodes running now (a sandbox and a harness busy), from the scheduler's counters."""
    return stats.started - stats.completed - stats.requeued_turn


def steady_start(batches: int) -> int:
    """The batch after which a run of `batches` is at its steady state (its second half)."""
    return max(1, batches // 2) - 1


def steady_rate(marks: list[tuple[float, int]], k: int) -> float:
    """Trajectories per second from batch k's mark to the last ((time, consumed so far) each)."""
    return (marks[-1][1] - marks[k][1]) / max(marks[-1][0] - marks[k][0], 1e-9)


def max_lag(batch: list[Trajectory], version: int) -> int:
    """The largest policy lag (version - the oldest sampled token's version) in a batch consumed at `version`."""
    return max((version - min(vs) for vs in map(token_versions, batch) if vs), default=0)


def lognormal(mean: float, cv: float, rng: random.Random) -> Callable[[], float]:
    """A sampler of lognormal latencies with the given mean and coefficient of variation."""
    sigma2 = math.log(1 + cv * cv)
    mu = math.log(mean) - sigma2 / 2
    return lambda: rng.lognormvariate(mu, math.sqrt(sigma2))


def empirical(samples: list[float], rng: random.Random) -> Callable[[], float]:
    """Resample measured latencies (bootstrap)."""
    return lambda: rng.choice(samples)


@dataclass
class _Req:
    remaining: int
    priority: tuple = ()
    versions: list[int] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SimEngine:
    """Batches concurrent requests: up to `slots` decode one token per step together, a step of r
    rows taking `step_time(r)`."""

    def __init__(self, slots: int, step_s: float, version: Callable[[], int], priority: bool = True,
                 row_cost: float = 0.0):
        if row_cost < 0:
            raise ValueError(f"row_cost must be >= 0, not {row_cost}")
        self.slots, self.step_s, self._version, self.priority = slots, step_s, version, priority
        self.row_cost = row_cost
        self.nominal_s = 0.0  # sum of step_time over the steps taken (busy_s is what the sleeps really took)
        self._queue: list[_Req] = []  # waiting for a slot
        self._running: list[_Req] = []
        self._wake = asyncio.Event()
        self.busy_s = 0.0
        self.slot_s = 0.0  # sum over steps of (occupied slots * step time)
        self.steps = 0
        self._t0 = time.monotonic()
        self._loop: asyncio.Task | None = None
        self.paused = False

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._loop = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._loop:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)

    def step_time(self, rows: int) -> float:
        """Seconds a step of `rows` rows takes: step_s * (1 + row_cost * (rows - 1))."""
        return self.step_s * (1.0 + self.row_cost * (rows - 1))

    async def generate(self, n_tokens: int, priority: tuple = ()) -> list[int]:
        req = _Req(n_tokens, priority)
        self._queue.append(req)
        self._wake.set()
        await req.done.wait()
        return req.versions

    async def _run(self) -> None:
        while True:
            if not (self._queue or self._running) or self.paused:
                self._wake.clear()
                await self._wake.wait()
                continue
            free = self.slots - len(self._running)
            if free > 0 and self._queue:
                # sorted() is stable: first come, first served among equal priorities
                admit = (sorted(self._queue, key=lambda r: r.priority) if self.priority else self._queue)[:free]
                for r in admit:
                    self._queue.remove(r)
                self._running += admit
            active = list(self._running)
            t = time.monotonic()
            nominal = self.step_time(len(active))
            await asyncio.sleep(nominal)
            self.nominal_s += nominal
            dt = time.monotonic() - t
            self.busy_s += dt
            self.steps += 1
            self.slot_s += dt * len(active) / self.slots
            v = self._version()
            for r in active:
                r.versions.append(v)
                r.remaining -= 1
                if r.remaining <= 0:
                    self._running.remove(r)
                    r.done.set()

    def utilization(self) -> dict[str, float]:
        """busy: fraction of time with any work; occupancy: mean fraction of slots filled."""
        wall = max(time.monotonic() - self._t0, 1e-9)
        return {"busy": self.busy_s / wall, "occupancy": self.slot_s / wall,
                "step_s": self.busy_s / self.steps if self.steps else self.step_s}


def sim_episode(engine: SimEngine, turns: int, tokens_per_turn: int, env_latency: Callable[[], float],
                reward: Callable[[str], float] = lambda task: 1.0):
    """An episode function for `RolloutScheduler`: turns of generate-then-wait."""

    async def run(slot: EpisodeSlot) -> Trajectory:
        ids: list[int] = []
        mask: list[int] = []
        versions: list[int] = []
        waits = []
        for _ in range(turns):
            await slot.before_turn()
            got = await engine.generate(tokens_per_turn, (slot.start_version, slot.group_id))  # oldest first
            ids += [7] * len(got)
            mask += [1] * len(got)
            versions += got
            wait = env_latency()
            waits.append(wait)
            await asyncio.sleep(wait)
            ids.append(9)  # the observation token
            mask.append(0)
            versions.append(-1)
        seg = Segment(token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), versions=versions)
        return Trajectory(session_id=f"{slot.task_id}-g{slot.group_id}-{slot.index}-a{slot.attempt}", segments=[seg],
                          reward=reward(slot.task_id), status="ok", termination="submitted",
                          task_id=slot.task_id, metadata={"env_waits": waits})

    return run


async def run_simulation(config, *, steps: int, slots: int, step_s: float, turns: int, tokens_per_turn: int,
                         env_latency: Callable[[], float], train_s: float, n_tasks: int = 16,
                         priority: bool = True, row_cost: float = 0.0) -> dict:
    """Drive a scheduler + simulated engine + simulated trainer for `steps` steps.

    The trainer takes `train_s` per step, then publishes a new version; the engine keeps
    decoding meanwhile (it is separate hardware), except that in-flight work naturally pauses
    under η = 0 because nothing new is admitted. `row_cost`: `SimEngine`'s (0: a step's time does
    not depend on its rows). Returns throughput and utilization figures.
    """
    import itertools

    from harnessrl.gym.scheduler import RolloutScheduler

    holder: dict = {}
    engine = SimEngine(slots, step_s, lambda: holder["s"].version, priority, row_cost)
    tasks = itertools.cycle([f"task{i}" for i in range(n_tasks)])
    sched = RolloutScheduler(config, sim_episode(engine, turns, tokens_per_turn, env_latency), tasks)
    holder["s"] = sched
    engine.start()
    await sched.start()
    t0 = time.monotonic()
    flight: list[int] = []  # episodes running (sandbox + harness busy), sampled every 10 ms

    async def probe() -> None:
        while True:
            await asyncio.sleep(0.01)
            flight.append(in_flight(sched.stats))

    prober = asyncio.create_task(probe())
    consumed = 0
    marks: list[tuple[float, int]] = []  # (time, trajectories consumed so far) after each batch
    lag = 0
    on_policy = True
    try:
        for _ in range(steps):
            batch = await sched.next_batch()
            V = sched.version
            lag = max(lag, max_lag(batch, V))
            on_policy &= all(v == V for traj in batch for v in token_versions(traj))
            consumed += len(batch)
            marks.append((time.monotonic(), consumed))
            await asyncio.sleep(train_s)
            await sched.advance_version()
        wall = time.monotonic() - t0
    finally:
        prober.cancel()
        await sched.close()
        await engine.stop()
    util = engine.utilization()
    # Steady state: from the end of the warm-up batches (half the run) to the last batch.
    steady = steady_rate(marks, steady_start(len(marks))) if len(marks) > 1 else 0.0
    return {"trajectories": consumed, "wall_s": wall, "traj_per_s": consumed / wall, "steady_traj_per_s": steady,
            "max_lag": lag,
            "on_policy": on_policy, "busy": util["busy"], "occupancy": util["occupancy"],
            "measured_step_s": util["step_s"], "mean_in_flight": sum(flight) / max(1, len(flight)),
            "stats": sched.stats.as_dict()}
