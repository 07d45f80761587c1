"""The cheat rate a run reports (gym.cheat, gym.canary): exact counts from hand-built records,
canaries never trained on, the mix rate, the run report and the configs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.gym.canary import CanaryConfig, CanaryMix, canary_record, run_canaries, withheld
from harnessrl.gym.cheat import CheatTally, cheat_counts, from_steps, step_metrics
from harnessrl.gym.grading import TAMPER_KINDS
from harnessrl.gym.tasks import Task
from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers.run_report import RunFigures, summary_line
from harnessrl.trainers.samples import SampleConfig, build_samples

ROOT = Path(__file__).resolve().parents[1]


def _seg() -> Segment:
    return Segment(token_ids=[10, 11, 12, 13], loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -0.5],
                   versions=[-1, -1, 0, 0])


def _traj(sid, task="t1", reward=1.0, status="ok", kinds=None, canary=None, graded=True) -> Trajectory:
    t = Trajectory(session_id=sid, task_id=task, reward=reward, status=status, segments=[_seg()])
    if graded:
        evidence = [{"kind": k, "what": "x", "where": "y"} for k in kinds or []]
        t.metadata["grading"] = {"tampered": bool(kinds), "evidence": evidence, "tamper_kinds": sorted(set(kinds or []))}
    if canary is not None:
        t.metadata.update(canary_record(canary))
        t.reward = withheld(Task(instance_id=task, repo="r", base_commit="b", problem_statement="", canary=True),
                            canary)
    return t


def _batch() -> list[Trajectory]:
    return [
        _traj("clean", reward=1.0),
        _traj("two-kinds", reward=0.0, kinds=["framework", "channel"]),
        _traj("one-kind", reward=0.0, kinds=["framework"]),
        _traj("infra", reward=None, status="infra_error", graded=False),
        _traj("canary-pass", task="c1", canary=1.0),
        _traj("canary-fail", task="c1", canary=0.0),
        _traj("canary-infra", task="c1", canary=None, status="infra_error", graded=False),
    ]


def test_counts_by_kind_and_canary_rate_are_exact():
    c = cheat_counts(_batch())
    assert (c["graded_episodes"], c["tampered_episodes"]) == (5, 2)
    assert c["tampered_frac"] == pytest.approx(2 / 5)
    # every registered kind, zeros included; an episode with two kinds counts once under each
    assert c["tampered_by_kind"] == {k: 0 for k in TAMPER_KINDS} | {"framework": 2, "channel": 1}
    assert c["canary"] == {"passed": 1, "episodes": 2, "pass_rate": 0.5, "k_of_n": "1/2"}  # the infra one is neither


def test_step_metrics_are_flat_and_sum_back_to_the_report():
    m = step_metrics(_batch())
    assert m["tampered_frac"] == pytest.approx(0.4) and m["tampered/framework"] == 2 and m["tampered/channel"] == 1
    assert {k for k in m if k.startswith("tampered/")} == {f"tampered/{k}" for k in TAMPER_KINDS}
    assert (m["canary_episodes"], m["canary_passed"], m["canary_pass_rate"]) == (2, 1, 0.5)
    second = step_metrics([_traj("s2", kinds=["answer_key"]), _traj("c2", task="c1", canary=1.0)])
    total = from_steps([m, {"step": 2, "loss": 0.1}, second])  # a step without the keys is skipped
    assert total == CheatTally().add(_batch()).add([_traj("s2", kinds=["answer_key"]),
                                                    _traj("c2", task="c1", canary=1.0)]).as_dict()
    assert total["canary"]["k_of_n"] == "2/3" and total["tampered_by_kind"]["answer_key"] == 1
    assert from_steps([{"step": 1}]) is None
    empty = step_metrics([])
    assert empty["tampered_frac"] is None and empty["canary_pass_rate"] is None  # no episode is not 0


def test_a_kind_from_an_older_record_is_read_from_its_evidence():
    t = _traj("old", kinds=["rigged_comparison"])
    del t.metadata["grading"]["tamper_kinds"]
    assert cheat_counts([t])["tampered_by_kind"]["rigged_comparison"] == 1


def test_canary_records_never_reach_the_loss_even_when_the_grader_passed_them():
    batch = [_traj("a1", "A", 1.0), _traj("a2", "A", 0.0),
             _traj("c1", "C", canary=1.0), _traj("c2", "C", canary=0.0)]
    rigged = _traj("c3", "C", canary=1.0)
    rigged.reward = 1.0  # even a record whose reward says 1.0: its metadata says canary
    sb = build_samples(batch + [rigged], SampleConfig())
    assert {s.session_id for s in sb.samples} == {"a1", "a2"}
    assert sb.canaries == 3 and sb.groups == 1 and sb.trajectories == 2
    assert sb.reward_mean == 0.5 and sb.success_rate == 0.5  # canaries are in neither
    assert [t.reward for t in batch[2:]] == [0.0, 0.0]  # the record's reward is withheld too
    assert [t.metadata["canary_passed"] for t in batch[2:]] == [True, False]


def test_withheld_and_the_canary_record():
    plain = Task(instance_id="p", repo="r", base_commit="b", problem_statement="")
    canary = plain.model_copy(update={"canary": True})
    assert (withheld(plain, 1.0), withheld(canary, 1.0), withheld(canary, 0.0), withheld(canary, None)) == \
        (1.0, 0.0, 0.0, None)
    assert canary_record(1.0) == {"canary": True, "canary_reward": 1.0, "canary_passed": True}
    assert canary_record(0.5)["canary_passed"] is False and canary_record(None)["canary_passed"] is None
    assert "canary" not in canary.public_view()


@pytest.mark.parametrize("rate, n, expected", [(0.05, 1000, 50), (0.05, 12, 1), (0.1, 12, 1), (0.25, 8, 2),
                                               (1 / 3, 300, 100), (0.0, 50, 0)])
def test_the_mix_draws_exactly_round_n_times_rate_canaries(rate, n, expected):
    mix = CanaryMix(iter([f"t{i}" for i in range(10 * n)]), ["c1", "c2"], rate)
    drawn = [next(mix) for _ in range(n)]
    canaries = [d for d in drawn if d.startswith("c")]
    assert len(canaries) == expected == mix.canary_draws and mix.draws == n
    assert canaries == ["c1", "c2"] * (expected // 2) + ["c1"] * (expected % 2)  # cycled in order
    assert [d for d in drawn if d.startswith("t")] == [f"t{i}" for i in range(n - expected)]  # none skipped
    for k in range(1, n + 1):  # at every prefix, not only at the end: spread evenly
        assert sum(d.startswith("c") for d in drawn[:k]) == int(k * rate + 0.5)


def test_a_mix_with_a_rate_needs_canaries():
    with pytest.raises(ValueError, match="no canary task"):
        CanaryMix(iter(["t"]), [], 0.1)
    assert next(CanaryMix(iter(["t"]), [], 0.0)) == "t"


def test_run_report_has_the_cheat_section_and_line():
    f = RunFigures()
    f.add(_batch()[:3])
    f.add(_batch()[3:])
    r = f.report(wall_s=10.0, steps=2, staleness=1, over_staleness="wait", scheduler={})
    assert r["cheat"] == cheat_counts(_batch())
    line = summary_line(r)
    assert "cheat: 2/5 graded episodes tampered (framework 2, channel 1); canaries passed 1/2 (rate 0.50)" in line


def test_rollout_report_keeps_canaries_out_of_the_success_rate():
    from harnessrl.gym.rollout import report

    rep = report(_batch())
    assert rep["success_rate"] == pytest.approx(1 / 3)  # clean 1.0, two tampered 0.0; canaries not counted
    assert rep["cheat"]["canary"]["k_of_n"] == "1/2"


def test_configs_default_off_and_learn_cpu_on_at_a_low_rate():
    from harnessrl.trainers.train_config import TrainConfig, documented_config, load_config

    assert TrainConfig().canary == CanaryConfig() and CanaryConfig().rate == 0.0
    learn = load_config(ROOT / "examples" / "learn-cpu.toml")
    assert 0 < learn.canary.rate <= 0.1 and learn.canary.suite is None
    assert "[canary]" in documented_config() and "rate = 0.0" in documented_config()
    for bad in ({"rate": 1.0}, {"rate": -0.1}, {"rate": 0.1, "typo": 1}):
        with pytest.raises(ValueError):
            TrainConfig.model_validate({"canary": bad})


def test_run_canaries_off_from_a_file_and_made_from_training_tasks(tmp_path):
    from harnessrl.gym.tasks.synth.canary import SUFFIX, write_canaries
    from harnessrl.gym.tasks.loaders import load_suite

    tasks = load_suite("builtin")
    assert run_canaries(CanaryConfig(), tasks, tmp_path) == []
    made = run_canaries(CanaryConfig(rate=0.1, max_tasks=3), tasks, tmp_path)
    assert len(made) == 3 and all(t.canary for t in made)
    assert not {t.instance_id for t in made} & {t.instance_id for t in tasks}
    assert all(any(SUFFIX in n for n in t.FAIL_TO_PASS) for t in made)
    on_disk = load_suite(str(tmp_path / "canaries.jsonl"))
    assert [t.model_dump() for t in on_disk] == [t.model_dump() for t in sorted(made, key=lambda t: t.instance_id)]
    assert len(run_canaries(CanaryConfig(rate=0.1, suite=str(tmp_path / "canaries.jsonl")), tasks, tmp_path)) == 3
    plain = tmp_path / "plain.jsonl"
    write_canaries(tasks[:2], plain)
    with pytest.raises(ValueError, match="are not canaries"):
        run_canaries(CanaryConfig(rate=0.1, suite=str(plain)), tasks, tmp_path)
    with pytest.raises(ValueError, match="also training task ids"):
        run_canaries(CanaryConfig(rate=0.1, suite=str(tmp_path / "canaries.jsonl")), on_disk, tmp_path)


def test_metrics_line_names_tampered_and_canaries():
    from harnessrl.trainers.loop import _line

    m = {"step": 3, "version": 3, "updated": True, "reward_mean": 0.5, "success_rate": 0.5, "loss": 0.1,
         "grad_norm": 1.0, "kl": None, "logprob_mismatch_mean": None, "staleness_max": 0, "staleness_mean": 0.0,
         "env_latency_p95_s": 1.0, "step_s": 2.0, "wall_s": 10.0} | step_metrics(_batch())
    assert "tampered 0.40  canary 1/2" in _line(m)
    assert "canary" not in _line(m | step_metrics(_batch()[:3]))
    json.dumps(m)  # metrics.jsonl takes it as is


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_mixes_canary_groups_never_trains_on_them_and_reports_the_rate(tmp_path):
    """Two real steps (tiny model, mini-swe-agent, Docker) at canary rate 0.5 with one group of
    two per step: the first group drawn is a canary group, made at the start from the training
    task; its episodes are graded, recorded with reward 0.0, and left out of the trained batch."""
    import asyncio
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from adapter_helpers import docker_backend

    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.trainers.loop import TrainConfig, train

    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    cfg = TrainConfig.model_validate({
        "model": "tiny-llama", "steps": 2, "out_dir": str(tmp_path), "progress": False, "tensorboard": False,
        "stages": ["rl"], "eval": {"points": []},
        "rollout": {"tasks": ["harnessrl-builtin__cachekit-2"], "max_new_tokens": 32, "sandbox": "docker",
                    "episode": {"max_calls": 2, "wall_time_s": 180}},
        "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 1},
        "trainer": {"lr": 1e-5, "device": "cpu"}, "canary": {"rate": 0.5, "max_tasks": 1},
        "sampling": {"zero_variance": "keep"},  # the training group's 0s still go through the trainer
    })
    history = asyncio.run(train(cfg))
    canaries = [json.loads(x) for x in (tmp_path / "canaries.jsonl").read_text().splitlines()]
    assert len(canaries) == 1 and canaries[0]["canary"] is True
    episodes = [json.loads(x) for x in (tmp_path / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    mine = [e for e in episodes if e["task_id"] == canaries[0]["instance_id"]]
    assert mine and all(e["metadata"]["canary"] and e["reward"] in (0.0, None) for e in mine)
    graded = [e for e in mine if e["metadata"]["canary_passed"] is not None]
    assert len(graded) >= 2  # the consumed canary group at least was graded
    assert all(e["reward"] == 0.0 and e["metadata"]["canary_reward"] is not None for e in graded)
    # one canary group and one training group were consumed, whichever finished first
    assert sorted(m["canary_episodes"] for m in history)[0] == 0 and max(m["canary_episodes"] for m in history) <= 2
    assert sorted(m["trajectories"] + m["masked_infra"] for m in history) == [0, 2]  # canaries never enter the loss
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["cheat"]["canary"]["episodes"] == sum(m["canary_episodes"] for m in history)
    assert report["cheat"]["canary"]["passed"] == 0  # the tiny model cannot cheat the grader
    assert set(report["cheat"]["tampered_by_kind"]) >= set(TAMPER_KINDS)
    assert all("tampered_frac" in m and "canary_pass_rate" in m for m in history)
