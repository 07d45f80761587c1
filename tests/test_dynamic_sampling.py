"""Dynamic sampling and the curriculum on hand-built trajectories: which groups train, what the
step reports, which task comes next."""
from __future__ import annotations

import asyncio
import collections
import itertools
import random

import pytest

from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers.curriculum import Curriculum, CurriculumConfig
from harnessrl.trainers.dynamic_sampling import SamplingConfig, outcome, select, split
from harnessrl.trainers.samples import SampleConfig, build_samples

_sid = itertools.count()


def traj(task: str, reward: float | None, group: int | None = None, status: str = "ok", canary: bool = False) -> Trajectory:
    meta = {} if group is None else {"group_id": group}
    if canary:
        meta["canary"] = True
    return Trajectory(session_id=f"s{next(_sid)}", task_id=task, reward=reward, status=status, metadata=meta,
                      segments=[Segment(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5],
                                        versions=[-1, 0, 0])])


def group(task: str, gid: int, rewards: list[float | None], **kw) -> list[Trajectory]:
    return [traj(task, r, gid, **kw) for r in rewards]


def sessions(ts: list[Trajectory]) -> set[str]:
    return {t.session_id for t in ts}


def feeder(*batches: list[Trajectory]):
    queue = list(batches)
    calls = []

    async def next_batch() -> list[Trajectory]:
        calls.append(1)
        return queue.pop(0) if queue else []

    return next_batch, calls


def test_split_sorts_groups_by_what_the_baseline_sees():
    mixed = group("A", 1, [1.0, 0.0, 0.0, 0.0])
    zeros = group("B", 2, [0.0, 0.0, 0.0, 0.0])
    ones = group("C", 3, [1.0, 1.0])
    one_scored = group("D", 4, [1.0]) + group("D", 4, [None, None], status="infra_error")
    canary = group("E", 5, [0.0, 1.0], canary=True)  # never rewarded, never trained on
    infra = group("F", 6, [None, None], status="infra_error")
    # an infra failure's reward is ignored: this group is 0, 0 for the baseline
    infra_reward = group("G", 7, [0.0]) + group("G", 7, [1.0], status="infra_error") + group("G", 7, [0.0])
    good, flat, unscored = split(mixed + zeros + ones + one_scored + canary + infra + infra_reward, SampleConfig())
    assert [g[0].task_id for g in good] == ["A"]
    assert [g[0].task_id for g in flat] == ["B", "C", "D", "G"]
    assert [g[0].task_id for g in unscored] == ["E", "F"]
    # REINFORCE has no baseline: any nonzero reward is signal
    good, flat, _ = split(mixed + zeros + ones, SampleConfig(baseline="none"))
    assert [g[0].task_id for g in good] == ["A", "C"] and [g[0].task_id for g in flat] == ["B"]
    # truncated episodes left out of the baseline do not make a group informative
    trunc = group("H", 8, [0.0, 0.0]) + group("H", 8, [1.0], status="truncated")
    assert [g[0].task_id for g in split(trunc, SampleConfig(truncated="drop"))[1]] == ["H"]
    assert [g[0].task_id for g in split(trunc, SampleConfig(truncated="keep"))[0]] == ["H"]


def test_zero_variance_matches_the_trainers_degenerate_groups():
    """The filter and the trainer agree on which groups carry no advantage, on random batches."""
    rng = random.Random(7)
    for _ in range(200):
        batch = []
        for gid in range(rng.randint(1, 5)):
            for _ in range(rng.randint(1, 4)):
                status = rng.choice(["ok", "ok", "ok", "infra_error", "truncated"])
                reward = None if rng.random() < 0.1 else rng.choice([0.0, 1.0])
                batch.append(traj(f"T{gid}", reward, gid, status=status))
        cfg = SampleConfig(truncated=rng.choice(["keep", "drop", "zero_advantage"]))
        good, flat, _ = split(batch, cfg)
        built = build_samples(batch, cfg)
        assert len(flat) == built.degenerate_groups
        assert len(good) + len(flat) == built.groups
        for g in good:  # every informative group's members get a nonzero advantage
            assert any(built.advantages.get(t.session_id) for t in g)


def test_keep_trains_on_everything_and_reports_the_share():
    batch = group("A", 1, [1.0, 0.0]) + group("B", 2, [0.0, 0.0])
    nb, calls = feeder(batch)
    sel = asyncio.run(select(nb, SamplingConfig(zero_variance="keep"), SampleConfig(), 2))
    assert sessions(sel.train) == sessions(batch) and len(calls) == 1
    assert sel.metrics() == {"groups": 2, "zero_var_groups": 1, "zero_var_frac": 0.5, "groups_dropped": 0,
                             "refills": 0, "trained_trajectories": 4}


def test_drop_leaves_flat_groups_out_and_a_step_with_nothing_left_trains_nothing():
    a, b = group("A", 1, [1.0, 0.0]), group("B", 2, [0.0, 0.0])
    canary = group("C", 3, [1.0], canary=True)
    nb, _ = feeder(a + b + canary)
    sel = asyncio.run(select(nb, SamplingConfig(zero_variance="drop"), SampleConfig(), 2))
    assert sessions(sel.train) == sessions(a + canary)  # the canary rides along with a real update
    assert sessions(sel.seen) == sessions(a + b + canary)
    assert (sel.groups, sel.zero_variance, sel.dropped) == (2, 1, 1)
    nb, _ = feeder(b + group("D", 4, [1.0, 1.0]) + canary)
    sel = asyncio.run(select(nb, SamplingConfig(zero_variance="drop"), SampleConfig(), 2))
    assert sel.train == [] and sel.zero_variance_frac == 1.0 and sel.dropped == 2


def test_refill_takes_more_batches_until_enough_informative_groups():
    flat = group("B", 1, [0.0, 0.0])
    good1, good2 = group("A", 2, [1.0, 0.0]), group("C", 3, [0.0, 1.0])
    nb, calls = feeder(flat + good1, group("D", 4, [1.0, 1.0]), good2, group("E", 5, [1.0, 0.0]))
    sel = asyncio.run(select(nb, SamplingConfig(zero_variance="refill", max_refills=5), SampleConfig(), 2))
    assert sessions(sel.train) == sessions(good1 + good2)
    assert len(calls) == 3 and sel.refills == 2 and sel.dropped == 2 and sel.groups == 4
    # the cap: after max_refills extra batches it trains on what it has
    nb, calls = feeder(flat, group("D", 4, [0.0, 0.0]), good1)
    sel = asyncio.run(select(nb, SamplingConfig(zero_variance="refill", max_refills=1), SampleConfig(), 2))
    assert sel.train == [] and len(calls) == 2 and sel.refills == 1


def test_outcome_counts_every_episode_dropped_groups_included():
    batch = (group("A", 1, [1.0, 0.0]) + group("B", 2, [1.0, 1.0]) + group("C", 3, [1.0], canary=True)
             + group("D", 4, [None], status="infra_error"))
    assert outcome(batch, SampleConfig()) == {"reward_mean": 0.75, "success_rate": 0.75, "masked_infra": 1}
    assert outcome([], SampleConfig()) == {"reward_mean": None, "success_rate": None, "masked_infra": 0}


def test_curriculum_favours_tasks_the_policy_sometimes_solves():
    cur = Curriculum(["never", "half", "always", "untried"], CurriculumConfig(seed=3, floor=0.05))
    cur.observe(group("never", 1, [0.0] * 8) + group("half", 2, [1.0, 0.0] * 4) + group("always", 3, [1.0] * 8))
    assert cur.weight("untried") == 1.0
    assert cur.weight("half") == pytest.approx(1.0)  # p = 5/10
    assert cur.weight("never") == pytest.approx(4 * 0.1 * 0.9)  # p = 1/10
    assert cur.weight("always") == pytest.approx(cur.weight("never"))
    draws = collections.Counter(next(cur) for _ in range(4000))
    total = 1.0 + 1.0 + 0.36 + 0.36
    for t, w in [("half", 1.0), ("untried", 1.0), ("never", 0.36), ("always", 0.36)]:
        assert draws[t] / 4000 == pytest.approx(w / total, abs=0.03)
    rep = cur.report()
    assert (rep["never_solved"], rep["sometimes_solved"], rep["always_solved"], rep["untried"]) == (1, 1, 1, 1)
    assert rep["tasks"]["half"] | {"weight": None} == {"draws": draws["half"], "attempts": 8, "successes": 4,
                                                      "pass_rate": 0.5, "weight": None}


def test_curriculum_floor_canaries_infra_and_seed():
    cur = Curriculum(["a", "b"], CurriculumConfig(floor=0.2))
    cur.observe(group("a", 1, [1.0] * 50) + group("b", 2, [1.0], canary=True)
                + group("b", 2, [None], status="infra_error") + group("zzz", 3, [1.0]))
    assert cur.weight("a") == 0.2  # 4p(1-p) is ~0.07: the floor keeps it drawn
    assert cur.records["b"].attempts == 0 and "zzz" not in cur.records
    same = Curriculum(["a", "b", "c"], CurriculumConfig(seed=11))
    again = Curriculum(["c", "b", "a"], CurriculumConfig(seed=11))
    assert [next(same) for _ in range(50)] == [next(again) for _ in range(50)]
    uniform = Curriculum(["b", "a"], CurriculumConfig(mode="uniform"))
    assert [next(uniform) for _ in range(4)] == ["a", "b", "a", "b"]
    with pytest.raises(ValueError, match="at least one task"):
        Curriculum([])


def test_peek_shows_the_next_draws_without_taking_them():
    for mode in ("pass_rate", "uniform"):
        cur = Curriculum(["a", "b", "c", "d"], CurriculumConfig(mode=mode, seed=5))
        next(cur)
        ahead = cur.peek(6)
        assert cur.peek(6) == ahead  # peeking twice changes nothing
        assert [next(cur) for _ in range(6)] == ahead
        assert sum(r.draws for r in cur.records.values()) == 7
