"""The rollout scheduler: η is never exceeded, η = 0 is on-policy, a hung env stalls no one."""
from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from harnessrl.gym.doubles.sim import lognormal, run_simulation
from harnessrl.gym.scheduler import RolloutScheduler, SchedulerConfig, StaleEpisode, token_versions
from harnessrl.gym.trajectory import Segment, Trajectory


def _sim(config: SchedulerConfig, seed: int, cv: float = 1.0, steps: int = 4, train_s: float = 0.01) -> dict:
    rng = random.Random(seed)
    return asyncio.run(run_simulation(config, steps=steps, slots=8, step_s=0.0005, turns=3, tokens_per_turn=4,
                                      env_latency=lognormal(0.01, cv, rng), train_s=train_s))


@settings(max_examples=16, deadline=None)
@given(eta=st.integers(0, 3), policy=st.sampled_from(["wait", "requeue", "mask", "hold"]), seed=st.integers(0, 10_000),
       cv=st.sampled_from([0.5, 1.0, 2.0]), pool=st.integers(2, 16))
def test_staleness_bound_is_never_exceeded(eta: int, policy: str, seed: int, cv: float, pool: int) -> None:
    # hold: `wait` for at most 5 ms, then mask, with a batch of admission slack
    hold = {"over_staleness": "wait", "max_wait_s": 0.005, "admission_slack": 1} if policy == "hold" else {}
    cfg = SchedulerConfig(**{"env_pool_size": pool, "group_size": 2, "groups_per_step": 2, "staleness": eta,
                             "over_staleness": policy, **hold})
    out = _sim(cfg, seed, cv)
    assert out["trajectories"] >= 4 * 2
    assert out["max_lag"] <= eta
    assert max(out["stats"]["staleness_hist"]) <= eta


def test_eta_zero_is_exactly_on_policy() -> None:
    cfg = SchedulerConfig(env_pool_size=16, group_size=4, groups_per_step=2, staleness=0)
    out = _sim(cfg, seed=3, steps=5)
    assert out["on_policy"] is True
    assert out["trajectories"] == 5 * 8  # exactly one batch per version, nothing extra
    assert set(out["stats"]["staleness_hist"]) == {0}


def test_async_lets_tokens_lag_but_within_eta() -> None:
    cfg = SchedulerConfig(env_pool_size=16, group_size=2, groups_per_step=2, staleness=2)
    out = _sim(cfg, seed=5, steps=6, train_s=0.05)
    hist = out["stats"]["staleness_hist"]
    assert max(hist) <= 2 and max(hist) >= 1  # off-policy data was actually used


def test_downweight_keeps_and_marks_stale_groups() -> None:
    async def main() -> tuple[list[Trajectory], dict]:
        gate = asyncio.Event()

        async def episode(slot):  # group 0 samples at v0, then its env waits two versions
            sampled_at = slot.version
            if slot.group_id == 0:
                await gate.wait()
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, sampled_at])
            return Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[seg], reward=1.0, status="ok",
                              task_id=slot.task_id)

        cfg = SchedulerConfig(env_pool_size=4, group_size=1, groups_per_step=1, staleness=5, over_staleness="downweight")
        s = RolloutScheduler(cfg, episode, itertools.cycle(["a", "b"]))
        await s.start()
        first = await s.next_batch()  # group 1 (group 0 is held)
        s.config.staleness = 0  # tighten η at run time: group 0's data is now too stale
        await s.advance_version()
        await s.advance_version()
        gate.set()
        batches = []
        while not any(t.session_id.startswith("0-") for b in batches for t in b):
            batches.append(await s.next_batch())
            await s.advance_version()
        await s.close()
        return [t for b in [first, *batches] for t in b], s.stats.as_dict()

    trajs, stats = asyncio.run(main())
    stale = next(t for t in trajs if t.session_id.startswith("0-"))
    lag = stale.metadata["consumed_at_version"] - 0  # sampled at v0, η is now 0
    assert lag >= 2 and stale.metadata["weight"] == 0.5 ** lag
    assert stats["downweighted"] >= 1
    # the trainer reads it: the stale rollout's advantage is scaled by its weight
    from harnessrl.trainers.samples import SampleConfig, build_samples
    stale.reward, stale.task_id = 1.0, "x"
    fresh = Trajectory(session_id="fresh", segments=[Segment([5, 6], [0, 1], [0.0, -0.1], [-1, 0])], reward=0.0,
                       status="ok", task_id="x")
    assert build_samples([stale, fresh], SampleConfig(normalize_std=False)).advantages == {
        stale.session_id: 0.5 * 0.5 ** lag, "fresh": -0.5}


def test_requeue_reruns_a_stale_episode_at_the_turn_check() -> None:
    async def main():
        calls = []

        async def episode(slot):
            calls.append((slot.task_id, slot.attempt, slot.start_version))
            await slot.before_turn()
            if slot.attempt == 0 and slot.group_id == 0:
                await asyncio.sleep(0.2)  # the trainer moves on meanwhile
                await slot.before_turn()  # raises StaleEpisode
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}-{slot.attempt}", segments=[seg], reward=1.0, status="ok",
                              task_id=slot.task_id)

        cfg = SchedulerConfig(env_pool_size=4, group_size=1, groups_per_step=1, staleness=0, over_staleness="requeue")
        s = RolloutScheduler(cfg, episode, itertools.cycle(["a", "b", "c"]))
        await s.start()
        await asyncio.sleep(0.05)
        await s.advance_version()  # forced bump while group 0 is mid-episode
        batch = await s.next_batch()  # task b, started at v1
        batch += await s.next_batch()  # task a again: aborted at its turn check, rerun at v1
        await s.close()
        return calls, batch, s.stats.as_dict()

    calls, batch, stats = asyncio.run(main())
    assert stats["requeued_turn"] == 1
    assert ("a", 1, 1) in calls  # rerun of task a, attempt 1, at the new version
    assert sorted(t.task_id for t in batch) == ["a", "b"]
    assert sorted(t.task_id for t in batch) == ["a", "b"]
    assert all(v == 1 for t in batch for v in t.segments[0].versions if v >= 0)


def test_hung_environment_times_out_without_stalling_the_others() -> None:
    async def main():
        async def episode(slot):
            if slot.task_id == "hang":
                await asyncio.Event().wait()  # never returns
            await asyncio.sleep(0.01)
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[seg], reward=1.0, status="ok",
                              task_id=slot.task_id)

        cfg = SchedulerConfig(env_pool_size=4, group_size=2, groups_per_step=4, staleness=1, episode_timeout_s=0.3)
        s = RolloutScheduler(cfg, episode, iter(["ok1", "hang", "ok2", "ok3"]))
        await s.start()
        batch = await asyncio.wait_for(s.next_batch(), 10)
        await s.close()
        return batch, s.stats.as_dict()

    batch, stats = asyncio.run(main())
    assert stats["timeouts"] == 2
    hung = [t for t in batch if t.task_id == "hang"]
    assert len(hung) == 2 and all(t.termination == "timeout" and not t.trainable for t in hung)
    assert sum(t.trainable for t in batch) == 6 and stats["completed"] == 8


def test_config_rejects_bad_fields() -> None:
    with pytest.raises(ValueError, match="staleness"):
        SchedulerConfig(staleness=-1)
    with pytest.raises(ValueError, match="over_staleness"):
        SchedulerConfig(over_staleness="pray")
    with pytest.raises(ValueError, match="pool"):
        SchedulerConfig(pool=3)
    with pytest.raises(ValueError, match="max_wait_s"):
        SchedulerConfig(over_staleness="mask", max_wait_s=5.0)
    with pytest.raises(ValueError, match="max_wait_s"):
        SchedulerConfig(max_wait_s=-1.0)
    with pytest.raises(ValueError, match="admission_slack"):
        SchedulerConfig(admission_slack=-1)
    assert StaleEpisode.__doc__


def test_mask_policy_masks_only_the_too_old_tokens() -> None:
    async def main():
        gate = asyncio.Event()

        async def episode(slot):  # group 0: one token at v0, then (after the env waits) one at v2
            first = slot.version
            if slot.group_id == 0:
                await gate.wait()
            seg = Segment([5, 6, 7, 8], [0, 1, 0, 1], [0.0, -0.1, 0.0, -0.2], [-1, first, -1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}", segments=[seg], reward=1.0, status="ok", task_id="t")

        cfg = SchedulerConfig(env_pool_size=4, group_size=1, groups_per_step=1, staleness=1, over_staleness="mask")
        s = RolloutScheduler(cfg, episode, itertools.cycle(["a"]))
        await s.start()
        await s.next_batch()  # group 1
        await s.advance_version()
        await s.next_batch()  # group 2 (group 0 is still waiting on its env)
        await s.advance_version()
        gate.set()
        out = []
        while not any(t.session_id == "0" for t in out):
            out += await s.next_batch()
        await s.close()
        return next(t for t in out if t.session_id == "0"), s.stats.as_dict()

    traj, stats = asyncio.run(main())
    seg = traj.segments[0]
    # consumed at v2 with η = 1: the v0 token is masked (version and logprob cleared), the v2 one kept
    assert seg.loss_mask == [0, 0, 0, 1] and seg.versions == [-1, -1, -1, 2] and seg.logprobs[1] == 0.0
    assert stats["masked_tokens"] == 1


def test_a_run_resumed_at_a_later_version_keeps_the_bound() -> None:
    cfg = SchedulerConfig(env_pool_size=8, group_size=2, groups_per_step=2, staleness=1)

    async def main():
        async def episode(slot):
            await asyncio.sleep(0.01)
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[seg], reward=1.0, status="ok",
                              task_id=slot.task_id)

        s = RolloutScheduler(cfg, episode, itertools.cycle(["a", "b", "c"]))
        await s.advance_version(7)  # resumed from a checkpoint at version 7
        await s.start()
        await asyncio.sleep(0.2)
        started_before_any_step = s.stats.started
        batch = await s.next_batch()
        await s.close()
        return started_before_any_step, batch

    started, batch = asyncio.run(main())
    assert started == (1 + 1) * 2 * 2  # (η + 1) steps of groups, not (7 + η + 1)
    assert {v for t in batch for v in t.segments[0].versions if v >= 0} == {7}


@pytest.mark.parametrize("priority, expected", [(True, ["v0", "v1", "v2", "v2-later"]),
                                                (False, ["v2", "v0", "v2-later", "v1"])])
def test_sim_engine_gives_free_slots_to_the_oldest_episode_first(priority: bool, expected: list[str]) -> None:
    """The simulated engine admits like the proxy's earliest-deadline priority makes a real
    engine admit: the oldest episode first, FIFO among equals (or plain FIFO when off)."""
    from harnessrl.gym.doubles.sim import SimEngine

    async def main() -> list[str]:
        engine = SimEngine(slots=1, step_s=0.001, version=lambda: 0, priority=priority)
        done: list[str] = []

        async def one(name: str, start_version: int) -> None:
            await engine.generate(3, (start_version,))
            done.append(name)

        tasks = [asyncio.create_task(one(n, v)) for n, v in (("v2", 2), ("v0", 0), ("v2-later", 2), ("v1", 1))]
        await asyncio.sleep(0)  # all four are queued before the engine takes a step
        engine.start()
        await asyncio.gather(*tasks)
        await engine.stop()
        return done

    assert asyncio.run(main()) == expected


def test_sim_engine_row_cost_makes_each_row_beyond_the_first_cost_its_fraction_of_a_step() -> None:
    """row_cost 0: a step takes step_s whatever its rows (the GPU regime); row_cost 0.5: a step
    of r rows takes step_s * (1 + 0.5 (r - 1)), the CPU regime. Three requests of 2, 4 and 4
    tokens on 4 slots: two steps of 3 rows, then two of 2; the engine's nominal busy time is the
    sum of exactly those step times."""
    from harnessrl.gym.doubles.sim import SimEngine

    with pytest.raises(ValueError, match="row_cost"):
        SimEngine(slots=4, step_s=0.001, version=lambda: 0, row_cost=-0.1)

    async def main(row_cost: float) -> tuple[float, int, list[float]]:
        engine = SimEngine(slots=4, step_s=0.001, version=lambda: 0, row_cost=row_cost)
        engine.start()
        await asyncio.gather(*(engine.generate(n) for n in (2, 4, 4)))
        await engine.stop()
        return engine.nominal_s, engine.steps, [engine.step_time(r) for r in (1, 2, 3, 4)]

    nominal, steps, times = asyncio.run(main(0.0))
    assert steps == 4 and times == [0.001] * 4 and nominal == pytest.approx(0.004, abs=1e-12)
    nominal, steps, times = asyncio.run(main(0.5))
    assert steps == 4 and times == pytest.approx([0.001, 0.0015, 0.002, 0.0025], abs=1e-12)
    assert nominal == pytest.approx(2 * 0.002 + 2 * 0.0015, abs=1e-12)


# -- failures: every episode ends in exactly one record --------------------------------------
class _Boom(BaseException):
    """A BaseException that is neither an Exception nor a stop signal."""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


_RAISED = st.sampled_from([ValueError, KeyError, RuntimeError, OSError, ZeroDivisionError, MemoryError, TimeoutError,
                           asyncio.CancelledError, GeneratorExit, StopAsyncIteration, _Boom, _Unprintable])
#: Where the episode function fails: before its first await, after one, by returning
#: something that is not a Trajectory, or by returning a record that breaks the scheduler's
#: own bookkeeping (metadata that is not a dict).
_STAGES = st.sampled_from(["before_await", "after_await", "not_a_trajectory", "breaks_bookkeeping"])


def _faulty_episode(plan: list, group_size: int):
    async def episode(slot):
        fault = plan[(slot.group_id * group_size + slot.index) % len(plan)]
        if fault is not None:
            stage, exc, msg = fault
            if stage == "before_await":
                raise exc(msg)
            await asyncio.sleep(0)
            if stage == "after_await":
                raise exc(msg)
            if stage == "not_a_trajectory":
                return {"session_id": "x"}
        await asyncio.sleep(0.001)
        seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
        traj = Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[seg], reward=float(slot.index % 2),
                          status="ok", task_id=slot.task_id)
        if fault is not None and fault[0] == "breaks_bookkeeping":
            traj.metadata = None
        return traj

    return episode


def _expected_error(fault) -> str:
    stage, exc, _ = fault
    if stage == "not_a_trajectory":
        return "TypeError: the episode returned dict"
    if stage == "breaks_bookkeeping":
        return "scheduler bookkeeping: AttributeError"
    return exc.__name__


@pytest.mark.timeout(600)
@settings(max_examples=80, deadline=None)
@given(plan=st.lists(st.one_of(st.none(), st.tuples(_STAGES, _RAISED, st.text(max_size=30))), min_size=1, max_size=8),
       pool=st.integers(1, 4), group_size=st.integers(1, 3))
def test_every_episode_ends_in_exactly_one_record_whatever_raises(plan, pool, group_size) -> None:
    """Arbitrary exceptions (BaseExceptions too) at every stage of the episode function and in
    the scheduler's own bookkeeping: next_batch returns every group, every slot is freed,
    each episode has exactly one record, and a failed one is a masked infra_error that names
    its exception; the trainer's sample builder takes the batch and masks exactly those."""
    from harnessrl.trainers.samples import SampleConfig, build_samples

    n_groups = len(plan)

    async def main():
        cfg = SchedulerConfig(env_pool_size=pool, group_size=group_size, groups_per_step=n_groups, staleness=0)
        s = RolloutScheduler(cfg, _faulty_episode(plan, group_size), iter([f"t{i}" for i in range(n_groups)]))
        await s.start()
        batch = await s.next_batch()
        state = (s._free, len(s._episodes), s.stats.as_dict())
        await s.close()
        return batch, state

    batch, (free, running, stats) = asyncio.run(main())
    assert free == pool and running == 0
    assert len(batch) == n_groups * group_size
    keys = [(t.metadata["group_id"], t.task_id, t.session_id) for t in batch]
    assert len(set(keys)) == len(batch)
    failed = 0
    for t in batch:
        gid = t.metadata["group_id"]
        index = int(t.session_id.rsplit("-", 1)[1])
        fault = plan[(gid * group_size + index) % len(plan)]
        if fault is None:
            assert (t.status, t.trainable) == ("ok", True)
            continue
        failed += 1
        assert (t.status, t.termination, t.reward, t.trainable) == ("infra_error", "infra", None, False)
        assert t.metadata["masked"] is True and t.metadata["error"].startswith(_expected_error(fault))
    assert stats["errors"] == failed and stats["completed"] == len(batch) == stats["started"]
    samples = build_samples(batch, SampleConfig(normalize_std=False))
    assert samples.masked_infra == failed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # asyncio leaves the loop mid-step
@pytest.mark.parametrize("signal", [KeyboardInterrupt, SystemExit])
def test_a_stop_signal_in_an_episode_stops_the_run(signal) -> None:
    async def main():
        async def episode(slot):
            await asyncio.sleep(0)
            raise signal()

        s = RolloutScheduler(SchedulerConfig(env_pool_size=1, group_size=1, groups_per_step=1), episode, iter(["a"]))
        await s.start()
        await s.next_batch()

    with pytest.raises(signal):
        asyncio.run(main())


def test_a_failing_task_source_makes_next_batch_raise_not_wait() -> None:
    def tasks():
        yield "a"
        raise OSError("the task file vanished")

    async def main():
        async def episode(slot):
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, 0])
            return Trajectory(session_id=f"{slot.group_id}", segments=[seg], reward=1.0, status="ok", task_id="a")

        s = RolloutScheduler(SchedulerConfig(env_pool_size=2, group_size=1, groups_per_step=2), episode, tasks())
        await s.start()
        try:
            await s.next_batch()
        finally:
            await s.close()

    with pytest.raises(RuntimeError, match="launch loop failed: OSError: the task file vanished"):
        asyncio.run(main())


def _gated_run(max_wait_s: float | None, release_after_s: float | None):
    """η = 1, one episode a group: group 0 samples a token at v0, then waits on its env until
    released (`release_after_s` after the second batch is asked for; None: after it returned),
    then samples one at the version of the moment. Returns the second batch, the batch that
    brought group 0, and the stats."""
    async def main():
        gate = asyncio.Event()

        async def episode(slot):
            first = slot.version
            if slot.group_id == 0:
                await gate.wait()
            seg = Segment([5, 6, 7, 8], [0, 1, 0, 1], [0.0, -0.1, 0.0, -0.2], [-1, first, -1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}", segments=[seg], reward=1.0, status="ok", task_id="t")

        cfg = SchedulerConfig(env_pool_size=4, group_size=1, groups_per_step=1, staleness=1, over_staleness="wait",
                              max_wait_s=max_wait_s)
        s = RolloutScheduler(cfg, episode, itertools.cycle(["a"]))
        await s.start()
        first = await s.next_batch()  # at v0: group 0 is not stale-prone yet
        assert [t.session_id for t in first] != ["0"]
        await s.advance_version()
        if release_after_s is not None:
            asyncio.get_running_loop().call_later(release_after_s, gate.set)
        second = await asyncio.wait_for(s.next_batch(), 30)  # at v1: group 0 started at v0, so it is due
        await s.advance_version()
        gate.set()
        later = list(second)
        while not any(t.session_id == "0" for t in later):
            later = await s.next_batch()
        await s.close()
        return second, later, s.stats.as_dict()

    return asyncio.run(main())


def test_a_bounded_hold_goes_on_without_the_straggler_and_masks_its_old_tokens() -> None:
    second, later, stats = _gated_run(max_wait_s=0.2, release_after_s=None)
    assert "0" not in [t.session_id for t in second] and len(second) == 1
    assert stats["wait_timeouts"] == 1 and stats["waited_groups"] >= 1
    straggler = next(t for t in later if t.session_id == "0")
    # consumed at v2 with η = 1: its v0 token is masked, its v2 one kept; every trained token within η
    seg = straggler.segments[0]
    assert seg.loss_mask == [0, 0, 0, 1] and seg.versions == [-1, -1, -1, 2] and seg.logprobs[1] == 0.0
    assert straggler.metadata["consumed_at_version"] == 2
    assert stats["masked_tokens"] == 1 and max(stats["staleness_hist"]) <= 1


def test_a_straggler_that_finishes_within_the_hold_joins_the_batch_unmasked() -> None:
    second, _, stats = _gated_run(max_wait_s=20.0, release_after_s=0.05)
    assert "0" in [t.session_id for t in second] and len(second) >= 2  # the due group joined a full batch
    straggler = next(t for t in second if t.session_id == "0")
    assert straggler.segments[0].loss_mask == [0, 1, 0, 1] and straggler.segments[0].versions == [-1, 0, -1, 1]
    assert stats["wait_timeouts"] == 0 and stats["masked_tokens"] == 0


@pytest.mark.parametrize("slack", [0, 1, 2])
def test_admission_slack_lets_exactly_that_many_batches_more_start(slack: int) -> None:
    async def main():
        gate = asyncio.Event()

        async def episode(slot):
            await gate.wait()
            seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
            return Trajectory(session_id=f"{slot.group_id}", segments=[seg], reward=1.0, status="ok", task_id="t")

        cfg = SchedulerConfig(env_pool_size=32, group_size=2, groups_per_step=2, staleness=1, admission_slack=slack)
        s = RolloutScheduler(cfg, episode, itertools.cycle(["a", "b"]))
        await s.start()
        await asyncio.sleep(0.1)
        started = s.stats.started
        gate.set()
        await s.close()
        return started

    # (η + 1 + slack) groups_per_step groups of 2 episodes outside the done batches: nothing consumed yet
    assert asyncio.run(main()) == (0 + 1 + 1 + slack) * 2 * 2


def _count_episode(gates: dict[int, asyncio.Event] | None = None):
    async def episode(slot):
        if gates is not None and slot.group_id in gates:
            await gates[slot.group_id].wait()
        await asyncio.sleep(0.005)
        seg = Segment([5, 6], [0, 1], [0.0, -0.1], [-1, slot.version])
        return Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[seg], reward=1.0, status="ok",
                          task_id=slot.task_id)
    return episode


def test_a_step_that_updated_nothing_does_not_stall_a_synchronous_run() -> None:
    """At η = 0 a batch whose step publishes no version (every episode masked) must not stop
    admission: the next batch's groups start when the trainer asks for it, at the same version."""
    async def main():
        cfg = SchedulerConfig(env_pool_size=8, group_size=2, groups_per_step=2, staleness=0)
        s = RolloutScheduler(cfg, _count_episode(), itertools.cycle(["a", "b"]))
        await s.start()
        first = await s.next_batch()
        await asyncio.sleep(0.1)
        started_while_training = s.stats.started  # synchronous: nothing starts before the step is over
        second = await asyncio.wait_for(s.next_batch(), 10)  # no advance_version: the step updated nothing
        await s.advance_version()
        third = await asyncio.wait_for(s.next_batch(), 10)
        await s.close()
        return first, started_while_training, second, third

    first, started, second, third = asyncio.run(main())
    assert started == 4 and len(first) == len(second) == len(third) == 4
    assert {v for t in first + second for v in token_versions(t)} == {0}
    assert {v for t in third for v in token_versions(t)} == {1}


def test_groups_a_wait_batch_takes_beyond_groups_per_step_free_their_places() -> None:
    """A `wait` batch that takes stale-prone groups beyond `groups_per_step` leaves as many groups
    outside the trainer's batches as before: admission counts the groups consumed, not V."""
    async def main():
        gates = {0: asyncio.Event(), 1: asyncio.Event()}
        cfg = SchedulerConfig(env_pool_size=32, group_size=1, groups_per_step=1, staleness=1, over_staleness="wait",
                              admission_slack=1)
        s = RolloutScheduler(cfg, _count_episode(gates), itertools.cycle(["a"]))
        await s.start()
        b0 = await asyncio.wait_for(s.next_batch(), 10)  # groups 0 and 1 held: group 2
        await s.advance_version()  # v1: groups 0 and 1 started at v0 are due now
        for g in gates.values():
            g.set()
        b1 = await asyncio.wait_for(s.next_batch(), 10)  # takes them both: more than groups_per_step
        await s.advance_version()
        await asyncio.sleep(0.1)
        outside = s.stats.started - s.stats.consumed  # group_size 1: episodes = groups
        await s.close()
        return b0, b1, outside

    b0, b1, outside = asyncio.run(main())
    assert [t.session_id for t in b0] == ["2-0"] and sorted(t.session_id for t in b1) == ["0-0", "1-0"]
    # (η + 1 + slack) groups_per_step groups outside the batches again (counted against V: 2)
    assert outside == (1 + 1 + 1) * 1
