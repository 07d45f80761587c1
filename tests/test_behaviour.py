"""Per-call sampling records -> per-token scoring parameters, and the records trainers refuse
(hand-built records shaped like the store's: each call's completion right after its prompt)."""
from __future__ import annotations

import re

import pytest

from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory
from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples


def sampling(t=1.0, p=1.0, k=-1, space="sampled") -> dict:
    return {"policy": "run", "temperature": t, "top_p": p, "top_k": k, "logprobs": space}


def call(cid, sid, idx, prompt, completion, rec) -> CallRecord:
    """A call record whose prompt (reusing none of its segment) is all new ids."""
    return CallRecord(call_id=cid, session_id=sid, index=idx, dialect="openai_chat", prompt_prefix_len=0,
                      new_prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * len(completion),
                      versions=[0] * len(completion), finish_reason="stop", segment=0,
                      flags={} if rec is None else {"sampling": rec})


def two_calls(first: dict | None, second: dict | None, sid="s1", task="A", reward=1.0) -> Trajectory:
    """Segment: 2 prompt tokens, 2 sampled (call 0), 1 template token, 3 sampled (call 1)."""
    ids = [10, 11, 12, 13, 14, 15, 16, 17]
    mask = [0, 0, 1, 1, 0, 1, 1, 1]
    seg = Segment(ids, mask, [-0.5 if m else 0.0 for m in mask], [0 if m else -1 for m in mask], call_ids=["c0", "c1"])
    calls = [call("c0", sid, 0, ids[:2], ids[2:4], first), call("c1", sid, 1, ids[:5], ids[5:], second)]
    return Trajectory(sid, [seg], reward, "ok", task_id=task, calls=calls)


def scored(traj, **kw):
    (s,) = build_samples([traj], SampleConfig(baseline="none"), **kw).samples
    return s.temperature, s.top_p, s.top_k


def test_each_call_is_scored_at_its_own_recorded_sampling():
    t, p, k = scored(two_calls(sampling(0.7, 0.5, 40), sampling(1.0)))
    # prompt and template positions are neutral; call 0's tokens at (0.7, 0.5, 40), call 1's at 1.0
    assert t == [1.0, 1.0, 0.7, 0.7, 1.0, 1.0, 1.0, 1.0]
    assert p == [1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert k == [-1, -1, 40, 40, -1, -1, -1, -1]


def test_tempered_logprobs_are_scored_without_the_filters():
    # SGLang's default space: log_softmax(logits / T) before top-p/top-k -> scored at (T, 1, -1)
    t, p, k = scored(two_calls(sampling(0.7, 0.5, 40, "tempered"), sampling(0.9, 0.8, -1, "tempered")))
    assert (t[2:4], p[2:4], k[2:4]) == ([0.7, 0.7], [1.0, 1.0], [-1, -1])
    assert (t[5:], p[5:], k[5:]) == ([0.9] * 3, [1.0] * 3, [-1] * 3)


def test_raw_logprobs_are_scored_at_the_models_own_distribution():
    # vLLM's default space: the model's logprobs before temperature and filters -> (1, 1, -1)
    t, p, k = scored(two_calls(sampling(0.7, 0.5, 40, "raw"), sampling(1.0, space="raw")))
    assert (t, p, k) == ([1.0] * 8, [1.0] * 8, [-1] * 8)


def test_records_without_calls_use_the_trainers_temperature():
    traj = two_calls(None, None)
    traj.calls = []
    t, p, k = scored(traj, temperature=0.6)
    assert t == [1.0, 1.0, 0.6, 0.6, 1.0, 0.6, 0.6, 0.6] and set(p) == {1.0} and set(k) == {-1}


@pytest.mark.parametrize("rec, field, words", [
    (sampling(0.0), "calls[1].flags.sampling.temperature", "greedy"),
    (sampling(1.0, 1.0, 1), "calls[1].flags.sampling.top_k", "greedy"),
    (None, "calls[1].flags.sampling", "does not say how it sampled"),
    (sampling(-1.0), "calls[1].flags.sampling.temperature", "not a temperature"),
    (sampling(float("nan")), "calls[1].flags.sampling.temperature", "not a temperature"),
    (sampling(1.0, 0.0), "calls[1].flags.sampling.top_p", "not a top_p"),
    (sampling(1.0, 1.0, 0), "calls[1].flags.sampling.top_k", "not a top_k"),
    (sampling(1.0, space="original"), "calls[1].flags.sampling.logprobs", "sampled, tempered, raw"),
])
def test_refused_records_name_the_field(rec, field, words):
    with pytest.raises(RecordError, match=rf"trajectory 's1' field '{re.escape(field)}'.*{words}"):
        build_samples([two_calls(sampling(), rec)], SampleConfig(baseline="none"))


def test_greedy_data_in_a_masked_episode_does_not_block_the_batch():
    greedy = two_calls(sampling(), sampling(0.0), sid="g")
    greedy.status = "infra_error"
    out = build_samples([greedy, two_calls(sampling(), sampling(), sid="ok")], SampleConfig(baseline="none"))
    assert out.masked_infra == 1 and [s.session_id for s in out.samples] == ["ok"]


def test_a_detached_call_scores_nothing():
    traj = two_calls(sampling(0.5), sampling(0.8))
    traj.calls[1].completion_ids = [99]  # its reply never reached the harness: in no segment
    traj.calls[1].flags["detached"] = "undelivered"
    traj.calls.append(call("c2", "s1", 2, [10, 11, 12, 13, 14], [15, 16, 17], sampling(0.8)))
    assert scored(traj)[0] == [1.0, 1.0, 0.5, 0.5, 1.0, 0.8, 0.8, 0.8]


def test_a_sampled_token_no_call_holds_is_refused():
    traj = two_calls(sampling(), sampling())
    traj.calls = traj.calls[:1]  # call 1's three sampled tokens lose their record
    with pytest.raises(RecordError, match=r"field 'calls'.*token \[5\] is sampled"):
        build_samples([traj], SampleConfig(baseline="none"))


def test_a_call_whose_completion_is_elsewhere_is_refused():
    traj = two_calls(sampling(), sampling())
    traj.calls[1].completion_ids = [99, 98, 97]
    with pytest.raises(RecordError, match=r"field 'calls\[1\].completion_ids'"):
        build_samples([traj], SampleConfig(baseline="none"))


@pytest.mark.parametrize("field, value", [("temperature", 0.0), ("top_k", 1)])
def test_a_train_config_with_greedy_run_sampling_is_refused(field, value):
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.trainers.loop import TrainConfig

    with pytest.raises(ValueError, match=rf"rollout\.{field}: {int(value)} is greedy sampling"):
        TrainConfig(rollout=RolloutConfig(**{field: value}))
    from harnessrl.gym.episode import EpisodeConfig

    ok = RolloutConfig(temperature=0.7, top_p=0.9, top_k=40, episode=EpisodeConfig(wall_time_s=300))
    assert TrainConfig(rollout=ok, scheduler={"episode_timeout_s": 2000}).rollout.top_k == 40
