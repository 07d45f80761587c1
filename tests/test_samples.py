"""Trajectories -> samples on hand-built records: advantages, masking, weighting, validation."""
from __future__ import annotations

import pytest

from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples, validate_trajectory


def seg(pattern: str, version: int = 0, first_tok: int = 10) -> Segment:
    """'P' = prompt/template token (mask 0), 'S' = sampled token (mask 1, logprob -0.5)."""
    ids = list(range(first_tok, first_tok + len(pattern)))
    mask = [1 if c == "S" else 0 for c in pattern]
    return Segment(
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        versions=[version if m else -1 for m in mask],
    )


def traj(sid, task="t1", reward=1.0, status="ok", segments=None) -> Trajectory:
    return Trajectory(session_id=sid, task_id=task, reward=reward, status=status, segments=segments or [seg("PPSS")])


def by_session(batch):
    out = {}
    for s in batch.samples:
        out.setdefault(s.session_id, []).append(s)
    return out


def test_grpo_group_mean_with_and_without_std():
    batch = [
        traj("a1", "A", 1.0), traj("a2", "A", 0.0),  # mean .5, population std .5
        traj("b1", "B", 1.0), traj("b2", "B", 1.0), traj("b3", "B", 1.0),  # all equal
    ]
    plain = build_samples(batch, SampleConfig(normalize_std=False))
    # A: 1 - .5 = +.5, 0 - .5 = -.5; B: 1 - 1 = 0
    assert plain.advantages == {"a1": 0.5, "a2": -0.5, "b1": 0.0, "b2": 0.0, "b3": 0.0}
    assert plain.groups == 2 and plain.degenerate_groups == 1
    normed = build_samples(batch, SampleConfig(normalize_std=True, std_eps=1e-6))
    # A: ±.5 / (.5 + 1e-6); B: 0 / (0 + 1e-6) = 0
    assert normed.advantages["a1"] == pytest.approx(0.5 / 0.500001, abs=1e-12)
    assert normed.advantages["a2"] == pytest.approx(-0.5 / 0.500001, abs=1e-12)
    assert normed.advantages["b1"] == 0.0
    # every sample of a trajectory carries its trajectory's advantage
    assert [s.advantage for s in by_session(normed)["a2"]] == [normed.advantages["a2"]]
    none = build_samples([traj("x", "", 0.25)], SampleConfig(baseline="none"))
    assert none.advantages == {"x": 0.25}  # REINFORCE: advantage = reward, task_id not needed


def test_infra_failures_are_masked_not_scored_zero():
    batch = [
        traj("ok1", "A", 1.0),
        traj("ok0", "A", 0.0),
        traj("infra", "A", 0.0, status="infra_error"),  # a reward on an infra failure is ignored
        traj("noreward", "A", None, status="ok"),  # scoring failed
    ]
    out = build_samples(batch, SampleConfig(normalize_std=False))
    # Scored as 0 the baseline would be 1/4 and ok1's advantage .75; masked it is 1/2.
    assert out.advantages == {"ok1": 0.5, "ok0": -0.5}
    assert set(by_session(out)) == {"ok1", "ok0"}
    assert out.masked_infra == 2 and out.trajectories == 2
    assert out.reward_mean == 0.5 and out.success_rate == 0.5


def test_split_trajectory_weight_sums_to_one():
    split = traj("split", "A", 1.0, segments=[seg("PPS"), seg("PPPSSS", first_tok=20), seg("PPP")])
    whole = traj("whole", "A", 0.0, segments=[seg("PPSSSS")])
    by_tokens = by_session(build_samples([split, whole], SampleConfig(segment_weighting="tokens")))
    # 1 and 3 sampled tokens (the third segment has none and yields no sample): 1/4 and 3/4
    assert [(s.segment, s.weight, s.n_sampled) for s in by_tokens["split"]] == [(0, 0.25, 1), (1, 0.75, 3)]
    assert [s.weight for s in by_tokens["whole"]] == [1.0]
    equal = by_session(build_samples([split, whole], SampleConfig(segment_weighting="equal")))
    assert [s.weight for s in equal["split"]] == [0.5, 0.5]
    # the split trajectory's samples keep the record's tokens and mask untouched
    assert by_tokens["split"][1].token_ids == [20, 21, 22, 23, 24, 25]
    assert by_tokens["split"][1].loss_mask == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    "policy, advantages, dropped, sessions",
    [
        # keep: baseline over 1, 0, 0 = 1/3 -> +2/3, -1/3, -1/3
        ("keep", {"w": 2 / 3, "l": -1 / 3, "tr": -1 / 3}, 0, {"w", "l", "tr"}),
        # drop: baseline over 1, 0 = 1/2; the truncated one is gone
        ("drop", {"w": 0.5, "l": -0.5}, 1, {"w", "l"}),
        # zero_advantage: baseline over 1, 0; truncated samples kept with advantage 0
        ("zero_advantage", {"w": 0.5, "l": -0.5, "tr": 0.0}, 0, {"w", "l", "tr"}),
    ],
)
def test_truncated_policies(policy, advantages, dropped, sessions):
    batch = [traj("w", "A", 1.0), traj("l", "A", 0.0), traj("tr", "A", 0.0, status="truncated")]
    out = build_samples(batch, SampleConfig(truncated=policy, normalize_std=False))
    assert out.advantages == pytest.approx(advantages)
    assert out.dropped_truncated == dropped and set(by_session(out)) == sessions
    # the truncated episode's reward is still reported (it was scored)
    assert out.reward_mean == pytest.approx(1 / 3)


def test_truncated_without_reward_only_trains_as_zero_advantage():
    batch = [traj("w", "A", 1.0), traj("tr", "A", None, status="truncated")]
    assert build_samples(batch, SampleConfig(truncated="keep")).masked_infra == 1
    out = build_samples(batch, SampleConfig(truncated="zero_advantage"))
    assert out.masked_infra == 0 and out.advantages["tr"] == 0.0


def test_rollout_without_sampled_tokens_counts_in_baseline_only():
    batch = [traj("w", "A", 1.0), traj("empty", "A", 0.0, segments=[seg("PPP")])]
    out = build_samples(batch, SampleConfig(normalize_std=False))
    assert out.advantages == {"w": 0.5} and out.trajectories == 1


def _bad(mutate, **kw):
    t = traj("sess-7", "A", 1.0, segments=[seg("PPSS"), seg("PPSS")])
    mutate(t)
    with pytest.raises(RecordError) as err:
        build_samples([t], SampleConfig(), **kw)
    return str(err.value)


@pytest.mark.parametrize(
    "mutate, kw, expected",
    [
        (lambda t: t.segments[1].logprobs.pop(), {}, "trajectory 'sess-7' segment 1 field 'logprobs': length 3 != len(token_ids) 4"),
        (lambda t: t.segments[0].loss_mask.__setitem__(1, 2), {}, "segment 0 field 'loss_mask': [1] = 2, must be 0 or 1"),
        (lambda t: t.segments[1].versions.__setitem__(3, -1), {}, "segment 1 field 'versions': [3] = -1 on a sampled token"),
        (lambda t: t.segments[1].versions.__setitem__(0, 0), {}, "segment 1 field 'versions': [0] = 0 on an unsampled token"),
        (lambda t: t.segments[0].versions.__setitem__(2, 5), {"current_version": 4}, "[2] = 5 is newer than the trainer's version 4"),
        (lambda t: t.segments[0].logprobs.__setitem__(2, float("nan")), {}, "segment 0 field 'logprobs': [2] = nan"),
        (lambda t: t.segments[0].logprobs.__setitem__(3, 0.7), {}, "segment 0 field 'logprobs': [3] = 0.7"),
        (lambda t: t.segments[0].token_ids.__setitem__(0, 50000), {"vocab_size": 49152}, "field 'token_ids': [0] = 50000"),
        (lambda t: setattr(t, "segments", [seg("SPS")]), {}, "segment 0 field 'loss_mask': [0] = 1: the first token"),
        (lambda t: setattr(t, "status", "running"), {}, "trajectory 'sess-7' field 'status': 'running' is not a finished status"),
        (lambda t: setattr(t, "task_id", ""), {}, "field 'task_id': is empty; GRPO groups rollouts by task_id"),
        (lambda t: setattr(t, "reward", float("inf")), {}, "field 'reward': inf is not a finite number"),
        (lambda t: setattr(t, "segments", [Segment([], [], [], [])]), {}, "segment 0 field 'token_ids': segment has no tokens"),
    ],
)
def test_validation_errors_name_session_segment_field(mutate, kw, expected):
    assert expected in _bad(mutate, **kw)


def test_record_error_carries_location_and_duplicates_are_rejected():
    t = traj("dup", "A", 1.0)
    with pytest.raises(RecordError, match="trajectory 'dup' field 'session_id': appears twice") as err:
        build_samples([t, traj("dup", "A", 0.0)], SampleConfig())
    assert err.value.field == "session_id"
    bad = traj("s", segments=[seg("PS"), seg("PPS")])
    bad.segments[1].versions[2] = -3
    with pytest.raises(RecordError) as err:
        validate_trajectory(bad)
    assert (err.value.session_id, err.value.segment, err.value.field) == ("s", 1, "versions")


def test_infra_records_are_not_validated_and_roundtrip_json_is():
    broken = traj("infra", "A", None, status="infra_error", segments=[Segment([1, 2], [0], [], [])])
    assert build_samples([broken, traj("ok", "A", 1.0)], SampleConfig()).masked_infra == 1
    rt = Trajectory.from_dict(traj("ok", "A", 1.0, segments=[seg("PPSS", version=3)]).to_dict())
    out = build_samples([rt], SampleConfig(), current_version=3)
    assert out.samples[0].versions == [-1, -1, 3, 3] and out.samples[0].logprobs == [0.0, 0.0, -0.5, -0.5]


def test_config_rejects_unknown_and_bad_fields():
    with pytest.raises(ValueError, match="truncated"):
        SampleConfig(truncated="maybe")
    with pytest.raises(ValueError, match="normalise_std"):
        SampleConfig(normalise_std=True)


def test_staleness_weight_scales_the_advantage_and_only_the_policy_gradient():
    import torch

    from harnessrl.trainers.losses import decoupled_ppo_loss, ppo_clip_loss

    stale = traj("a1", "A", 1.0)
    stale.metadata["weight"] = 0.25  # the scheduler's downweight: 0.5 ** 2 versions over η
    out = build_samples([stale, traj("a2", "A", 0.0)], SampleConfig(normalize_std=False))
    # the baseline uses the unweighted rewards (mean .5); only a1's advantage is scaled
    assert out.advantages == {"a1": 0.5 * 0.25, "a2": -0.5}
    assert [s.advantage for s in by_session(out)["a1"]] == [0.125]
    # positive homogeneity: scaling the advantage scales the per-token loss exactly
    g = torch.Generator().manual_seed(0)
    logp, prox, behav = (-torch.rand(2, 6, generator=g) for _ in range(3))
    adv = torch.tensor([[1.0] * 6, [-2.0] * 6])
    for c in (0.25, 0.5):
        assert torch.allclose(ppo_clip_loss(logp, behav, c * adv).per_token, c * ppo_clip_loss(logp, behav, adv).per_token)
        assert torch.allclose(decoupled_ppo_loss(logp, prox, behav, c * adv, behav_cap=5.0).per_token,
                              c * decoupled_ppo_loss(logp, prox, behav, adv, behav_cap=5.0).per_token)


@pytest.mark.parametrize("w", [0.0, 1.5, float("nan"), "half", True])
def test_bad_staleness_weight_is_named(w):
    bad = traj("a1")
    bad.metadata["weight"] = w
    with pytest.raises(RecordError, match=r"trajectory 'a1' field 'metadata.weight'"):
        build_samples([bad], SampleConfig())
