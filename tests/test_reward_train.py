"""A judge-rewarded task (no hidden tests) end to end: a rollout with the scripted policy records
the judge's call beside the episode and never as a policy segment; a failed judge masks the
episode with its reason; `harnessrl train` trains one step on the tiny model from the judge's
scores. Real harness (mini-swe-agent), Docker sandbox, proxy and engine; the judge is a scripted
OpenAI-compatible server on loopback."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.doubles.judge import ScriptedJudge
from harnessrl.gym.served import ServedApp
from harnessrl.gym.tasks.loaders import load_suite

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend  # noqa: E402

TASK = "harnessrl-builtin__cachekit-2"
RUBRIC = "The LRU cache must hold exactly maxsize entries."


def _need_stack() -> None:
    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")


def judge_task_file(tmp_path: Path) -> tuple[Path, object]:
    """The built-in task with its hidden tests taken away and a judge as its reward."""
    task = next(t for t in load_suite("builtin") if t.instance_id == TASK)
    row = {**task.model_dump(exclude_none=True), "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "test_patch": "",
           "reward": {"kind": "judge", "rubric": RUBRIC}}
    path = tmp_path / "judged.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (loaded,) = load_suite(str(path))
    assert loaded.FAIL_TO_PASS == [] and loaded.reward_kind().kind == "judge"
    return path, loaded


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_a_judged_rollout_records_the_judge_beside_the_episode_and_masks_its_failure(tmp_path: Path) -> None:
    _need_stack()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.grading.judge import JudgeConfig
    from harnessrl.gym.grading.verdict import RewardConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import RolloutConfig, run_rollout
    from harnessrl.trainers.samples import SampleConfig, build_samples

    path, task = judge_task_file(tmp_path)
    tokenizer = load_tokenizer("tiny-llama")
    engine = ScriptedEngine(tokenizer)
    engine.set_tasks([task], gold=True)

    def rollout(judge: ScriptedJudge, out: Path) -> tuple[dict, list[dict]]:
        with ServedApp(judge.app()) as j, ServedApp(engine.app()) as served:
            reward = RewardConfig(judge=JudgeConfig(base_url=f"{j.url}/v1", model="judge"))
            cfg = RolloutConfig(harness="mini-swe-agent", suite=str(path), tasks=[TASK], model="tiny-llama",
                                sandbox="docker", episode=EpisodeConfig(max_calls=8, wall_time_s=240, reward=reward))
            rep = asyncio.run(run_rollout(cfg, served.url, out, episodes=2, concurrency=2, progress=False))
        return rep, [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]

    judge = ScriptedJudge(scores=[1.0, 0.25])
    rep, trajs = rollout(judge, tmp_path / "ok")
    assert rep["episodes"] == 2 and rep["scored"] == 2 and rep["endings"] == {"submitted": 2}
    assert rep["reward_distribution"] == {"0.25": 1, "1.0": 1}
    assert len(judge.requests) == 2
    for t in trajs:
        g = t["metadata"]["grading"]
        assert (g["kind"], g["status"], g["tests"], g["agent_diff"]) == ("judge", "ok", [], task.patch)
        assert g["judge"]["score"] == t["reward"] and g["judge"]["latency_s"] > 0
        assert task.patch in g["judge"]["request"]["messages"][1]["content"]
    # Never trained: the record's calls are the policy's own (plan steps + submit), and the
    # samples' trained tokens are exactly their completions; the judge's prompt is in none.
    from harnessrl.gym.trajectory import Trajectory
    records = [Trajectory.from_dict(t) for t in trajs]
    assert all(len(r.calls) == len(task.gold_plan) + 1 for r in records)
    batch = build_samples(records, SampleConfig())
    assert sum(s.n_sampled for s in batch.samples) == sum(len(c.completion_ids) for r in records for c in r.calls)
    assert all("UNTRUSTED DIFF" not in tokenizer.decode(s.token_ids) for s in batch.samples)

    failing = ScriptedJudge("status", status=502, content="bad gateway")
    rep, trajs = rollout(failing, tmp_path / "masked")
    assert rep["scored"] == 0 and rep["failures_by_reason"] == {"infra": 2}
    for t in trajs:
        assert (t["reward"], t["status"], t["termination"]) == (None, "infra_error", "infra")
        assert t["metadata"]["error"] == "reward: judge http: the judge answered HTTP 502: bad gateway"
        assert t["metadata"]["grading"]["judge"]["failure"] == "http"


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_one_step_on_a_judge_rewarded_task_with_the_tiny_model(tmp_path: Path) -> None:
    _need_stack()
    from harnessrl.trainers.loop import TrainConfig, train

    path, _ = judge_task_file(tmp_path)
    # Two episodes run at once (env_pool_size 2), so the first group's two judge calls are
    # call 0 and call 1 or 2 (the second group's first episode starts when the first ends):
    # one 1.0 and one 0.0 whatever the order, a reward spread to learn from.
    judge = ScriptedJudge(scores=[1.0, 0.0, 0.0, 1.0])
    with ServedApp(judge.app()) as j:
        cfg = TrainConfig.model_validate({
            "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path / "run"), "progress": False,
            "tensorboard": False, "stages": ["rl"], "eval": {"points": []},
            "rollout": {"suite": str(path), "tasks": [TASK], "max_new_tokens": 32, "sandbox": "docker",
                        "episode": {"max_calls": 2, "wall_time_s": 180,
                                    "reward": {"judge": {"base_url": f"{j.url}/v1", "model": "judge"}}}},
            "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 1},
            "trainer": {"lr": 1e-5, "device": "cpu"},
        })
        (m,) = asyncio.run(train(cfg))
    assert m["trajectories"] == 2 and m["masked_infra"] == 0, m
    assert (m["zero_var_groups"], m["skipped"], m["updated"], m["version"]) == (0, False, True, 1)
    assert m["reward_mean"] == 0.5 and m["success_rate"] == 0.5
    assert m["tokens"] > 0 and m["grad_norm"] > 0  # a judge-made advantage moved the weights
    # (the loss itself may be exactly 0: at ratio 1, advantages +a and -a over equally long
    # completions cancel in the mean, while their gradients do not)
    lines = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    scored = [t for t in lines if t["reward"] is not None]
    assert len(scored) >= 2 and all(t["metadata"]["grading"]["judge"]["score"] == t["reward"] for t in scored)
    assert all(t["metadata"]["grading"]["kind"] == "judge" for t in scored)
    # Episodes still running when the run ended were cancelled (masked), never scored.
    assert all(t["status"] == "infra_error" for t in lines if t["reward"] is None)
    assert len(judge.requests) >= 2
