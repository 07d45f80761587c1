"""Held-out evaluation in `harnessrl train` (trainers/evaluate.py): the Wilson interval on
hand-computed numbers, why episodes failed read from records, the held-out guard (ids, gold
patches, functions; and train refusing a leaking config before anything starts), the config's
validation, and (docker) real evaluation episodes through mini-swe-agent against the scripted
engine: gold plans succeed 1.0, empty plans 0.0, with the right n, and no trainer takes them."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory
from harnessrl.trainers import evaluate as ev

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]


def test_wilson_interval_on_hand_computed_numbers():
    z2 = 1.959963984540054 ** 2
    lo, hi = ev.wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(z2 / (10 + z2))  # p = 0: upper bound z²/(n + z²) = 0.2775
    lo, hi = ev.wilson(10, 10)
    assert lo == pytest.approx(10 / (10 + z2)) and hi == pytest.approx(1.0)
    lo, hi = ev.wilson(5, 10)  # symmetric about 0.5: 0.5 ± z·sqrt(1/40 + z²/400) / (1 + z²/10)
    assert (lo, hi) == (pytest.approx(0.236593, abs=1e-6), pytest.approx(0.763407, abs=1e-6))
    assert ev.wilson(0, 0) == (None, None)


def _call(i: int, finish: str) -> CallRecord:
    return CallRecord(f"c{i}", "s", i, "openai_chat", 0, [1, 2], [3], [-0.1], [0], finish, 0)


def _traj(sid: str, reward, status="ok", termination="submitted", finishes=("tool",), task="t1") -> Trajectory:
    return Trajectory(sid, [Segment([1, 2, 3], [0, 0, 1], [0.0, 0.0, -0.1], [-1, -1, 0])], reward, status, termination,
                      task_id=task, calls=[_call(i, f) for i, f in enumerate(finishes)])


def _tool(c: CallRecord) -> bool:  # in these hand-built records, "tool" marks a reply with a tool call
    return c.finish_reason == "tool"


def test_tool_calls_are_read_as_the_proxy_parsed_them():
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.render import Renderer
    from harnessrl.gym.proxy.toolcalls import load_tool_format

    tok = load_tokenizer("tiny-llama")
    made = ev.tool_call_reader(Renderer(tok, load_tool_format("hermes")))
    for text, want in (('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', True),
                       ("I would run ls.", False), ('<tool_call>\n{"name": "bash", "argu', False)):
        c = _call(0, "stop")
        c.completion_ids = tok.encode(text, add_special_tokens=False)
        assert made(c) is want, text
    c.completion_ids = tok.encode('<tool_call>\n{"name": "test_ttl.py", "arguments": {}}\n</tool_call>',
                                  add_special_tokens=False)
    assert made(c) is True
    c.flags["tool_call"] = "tool_call_unknown_tool"  # as the proxy flags a tool the request did not offer
    assert made(c) is False


def test_outcomes_and_summary_come_from_the_records():
    trajs = [
        _traj("ok", 1.0),
        _traj("fmt", 0.0, "truncated", "call_limit", ("stop", "length")),  # no reply parsed as a tool call
        _traj("lim", 0.0, "truncated", "call_limit", ("tool", "tool")),
        _traj("slow", 0.0, "truncated", "timeout"),
        _traj("edit", 0.0, "ok", "submitted", ("tool", "tool"), task="t2"),
        _traj("crash", 0.0, "ok", "harness_crashed"),
        _traj("infra", None, "infra_error", "sandbox_died"),
    ]
    assert [ev.outcome(t, _tool) for t in trajs] == ["success", "no_tool_call", "limit", "limit", "wrong_edit",
                                             "harness_error", "masked_infra"]
    s = ev.summarize("post_sft", trajs, _tool, timed_out=1)
    assert (s["n"], s["episodes"], s["successes"], s["success_rate"]) == (6, 8, 1, 1 / 6)
    assert s["ci95"] == list(ev.wilson(1, 6)) and s["reward_mean"] == pytest.approx(1 / 6)
    assert s["outcomes"] == {"masked_infra": 2, "success": 1, "harness_error": 1, "no_tool_call": 1, "limit": 2,
                             "wrong_edit": 1}
    assert s["tool_call_rate"] == pytest.approx(7 / 9) and s["by_task"] == {"t1": [1.0, 0.0, 0.0, 0.0, 0.0],
                                                                            "t2": [0.0]}
    assert ev.line(s).startswith("eval post_sft success 1/6 = 0.17 (95% CI 0.03-0.56)")


def test_eval_records_are_refused_by_the_rl_trainer():
    from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples

    a, b = _traj("a", 1.0, finishes=()), _traj("b", 0.0, finishes=())  # hand-built segments, no call records
    assert build_samples([a, b], SampleConfig()).samples  # the same records, unmarked, train
    b.metadata["eval"] = "pre_sft"
    with pytest.raises(RecordError, match="held-out evaluation episode") as e:
        build_samples([a, b], SampleConfig())
    assert e.value.field == "metadata.eval"


# -- the guard -------------------------------------------------------------------------------------
def _task(iid: str, patch: str):
    from harnessrl.gym.tasks import Task

    return Task(instance_id=iid, repo="r/x", base_commit="0" * 40, problem_statement="p", patch=patch,
                FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[])


def test_guard_refuses_held_out_tasks_in_rl_or_sft(tmp_path):
    train, held = [_task("a", "pa"), _task("b", "pb")], [_task("h", "ph")]
    ev.guard_disjoint(train, held, ["a", "b"])  # disjoint: fine
    with pytest.raises(ev.LeakError, match=r"\['h'\] are also RL tasks"):
        ev.guard_disjoint(train + [_task("h", "ph")], held)
    with pytest.raises(ev.LeakError, match=r"sft.data: holds teacher episodes of held-out task\(s\) \['h'\]"):
        ev.guard_disjoint(train, held, ["a", "h"])
    with pytest.raises(ev.LeakError, match="gold patch of an RL task: \\['h = b'\\]"):
        ev.guard_disjoint(train, [_task("h", "pb")])
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"instance_id": i, "functions": [["p", "m.py", f]]}) + "\n"
                            for i, f in (("a", "f"), ("b", "g"), ("h", "g"), ("s", "k"))))
    with pytest.raises(ev.LeakError, match=r"mutate function\(s\) that RL tasks mutate: \['p/m.py/g'\]"):
        ev.guard_disjoint(train, held, [], meta, meta)
    ev.guard_disjoint(train[:1], held, [], meta, meta)  # only b shares g with h
    with pytest.raises(ev.LeakError, match="p/m.py/g"):  # an SFT record of b is training on g too
        ev.guard_disjoint(train[:1], held, ["b"], meta, meta)


def test_train_refuses_a_leaking_config_before_anything_starts(tmp_path, capsys):
    from adapter_helpers import builtin_task
    from harnessrl.trainers.loop import TrainConfig, train

    task = builtin_task()
    other = task.model_copy(update={"instance_id": task.instance_id + "-held", "patch": task.patch + "\n"})
    for name, rows in (("train.jsonl", [task]), ("heldout.jsonl", [other])):
        (tmp_path / name).write_text("".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in rows))
    data = tmp_path / "teacher" / "trajectories.jsonl"
    data.parent.mkdir()
    data.write_text(_traj("x", 1.0, task=other.instance_id).to_json() + "\n")
    cfg = TrainConfig(model="tiny-llama", stages=["sft", "rl"], out_dir=str(tmp_path / "run"), progress=False,
                      sft={"data": str(data)}, rollout=TrainConfig().rollout.model_copy(update={
                          "suite": str(tmp_path / "train.jsonl"), "difficulties": None}),
                      eval={"suite": str(tmp_path / "heldout.jsonl")})
    with pytest.raises(ev.LeakError, match=f"holds teacher episodes of held-out task\\(s\\) \\['{other.instance_id}'\\]"):
        asyncio.run(train(cfg))
    assert not (tmp_path / "run" / "rollouts").exists() and not (tmp_path / "run" / "eval").exists()


# -- the config --------------------------------------------------------------------------------------
def test_eval_and_prepare_config_validate():
    from harnessrl.trainers.loop import TrainConfig

    base = {"stages": ["sft", "rl"], "sft": {"data": "d/trajectories.jsonl"}, "rollout": {
        "suite": "s/train.jsonl", "episode": {"wall_time_s": 300, "reward": {"test_timeout_s": 120}}}}
    cfg = TrainConfig.model_validate(base | {"eval": {"suite": "s/heldout.jsonl"}})
    assert cfg.eval.points_for(cfg.stages) == ["pre_sft", "post_sft", "post_rl"]
    assert TrainConfig(eval={"suite": "s/heldout.jsonl"}).eval.points_for(["rl"]) == ["pre_sft", "post_rl"]
    assert not TrainConfig(eval={}).eval.enabled  # no held-out suite, no evaluation
    with pytest.raises(ValueError, match=r"eval.points: \['pre_sft', 'post_sft'\]: stages \['rl'\] do not reach \['post_sft'\]"):
        TrainConfig(stages=["rl"], eval={"suite": "h.jsonl", "points": ["post_sft", "pre_sft"]})
    with pytest.raises(ValueError, match="eval.suite: 's/train.jsonl' is also rollout.suite"):
        TrainConfig.model_validate(base | {"eval": {"suite": "s/train.jsonl"}})
    with pytest.raises(ValueError, match="eval.episodes_per_task"):
        TrainConfig(eval={"suite": "h.jsonl", "episodes_per_task": 0})
    with pytest.raises(ValueError, match="eval.transfer_episodes_per_task: 0 leaves the transfer harnesses no episode"):
        TrainConfig(eval={"suite": "h.jsonl", "transfer_episodes_per_task": 0})
    prep = {"tasks_dir": "s", "synth": {"seed": 3, "max_tasks": 20}, "teacher_episodes": 8}
    cfg = TrainConfig.model_validate(base | {"eval": {"suite": "s/heldout.jsonl"}, "prepare": prep})
    assert cfg.prepare.synth_config().seed == 3 and cfg.prepare.synth_config().out == "s"
    with pytest.raises(ValueError, match="eval.suite: 'x/heldout.jsonl': with prepare.tasks_dir it must be 's/heldout.jsonl'"):
        TrainConfig.model_validate(base | {"eval": {"suite": "x/heldout.jsonl"}, "prepare": prep})
    with pytest.raises(ValueError, match="prepare.synth.max_tasks"):
        TrainConfig.model_validate(base | {"prepare": prep | {"synth": {"max_tasks": 0}}})
    with pytest.raises(ValueError, match="prepare.synth.out"):
        TrainConfig.model_validate(base | {"prepare": prep | {"synth": {"out": "y"}}})
    with pytest.raises(ValueError, match="sft.data: 'd/t.jsonl': with prepare.teacher_episodes"):
        TrainConfig.model_validate(base | {"sft": {"data": "d/t.jsonl"}, "prepare": {"teacher_episodes": 2}})


def test_max_tasks_spreads_the_sample_over_the_sorted_ids(monkeypatch):
    from types import SimpleNamespace

    from harnessrl.gym.rollout import RolloutConfig

    ids = [f"p{p}-{i:02d}" for p in "abcd" for i in range(10)]  # 4 projects x 10 tasks
    monkeypatch.setattr(ev, "load_suite_tasks", lambda cfg: [SimpleNamespace(instance_id=i) for i in reversed(ids)])
    base = RolloutConfig()
    pick = ev.eval_task_ids(ev.EvalConfig(suite="x.jsonl", max_tasks=8), base)
    assert pick == ["pa-00", "pa-05", "pb-00", "pb-05", "pc-00", "pc-05", "pd-00", "pd-05"]  # every project
    assert ev.eval_task_ids(ev.EvalConfig(suite="x.jsonl"), base) == ids
    assert ev.eval_task_ids(ev.EvalConfig(suite="x.jsonl", max_tasks=99), base) == ids


def test_the_learning_example_config_loads():
    from harnessrl.trainers.loop import load_config

    cfg = load_config(ROOT / "examples" / "learn-cpu.toml")
    assert cfg.model == "smollm2-135m" and cfg.stages == ["sft", "rl"] and cfg.rollout.harness == "mini-swe-agent"
    assert cfg.eval.points_for(cfg.stages) == ["pre_sft", "post_sft", "post_rl"]
    assert Path(cfg.rollout.suite).name == "train.jsonl" and Path(cfg.eval.suite).name == "heldout.jsonl"
    assert cfg.prepare.teacher_episodes > 0 and cfg.prepare.tasks_dir is not None


# -- real evaluation episodes: mini-swe-agent in Docker, the scripted engine as the policy ------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_evaluate_runs_real_episodes_with_the_right_n_and_ci(tmp_path):
    from adapter_helpers import builtin_task, docker_backend
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.served import ServedApp
    from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples

    backend = docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    task = builtin_task()
    suite = tmp_path / "heldout.jsonl"
    suite.write_text(json.dumps(task.model_dump(mode="json")) + "\n")
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    base = RolloutConfig(harness="mini-swe-agent", model="tiny-llama", sandbox="docker", sandbox_pool_size=2,
                         episode=EpisodeConfig(max_calls=4, wall_time_s=300))
    cfg = ev.EvalConfig(suite=str(suite), episodes_per_task=2, concurrency=2, temperature=0.0)
    summaries = {}
    try:
        with ServedApp(engine.app()) as served:
            for point, gold in (("pre_sft", False), ("post_sft", True)):
                engine.set_tasks([task], gold=gold)
                summaries[point] = asyncio.run(ev.evaluate(point, cfg, base, served.url, tmp_path / "run"))
    finally:
        backend.reap(run_id=backend.run_id)
    pre, post = summaries["pre_sft"], summaries["post_sft"]
    assert (pre["n"], pre["successes"], pre["success_rate"], pre["reward_mean"]) == (2, 0, 0.0, 0.0)
    assert pre["outcomes"]["wrong_edit"] == 2  # it submitted at once (a tool call), the tests still fail
    assert (post["n"], post["successes"], post["success_rate"], post["reward_mean"]) == (2, 2, 1.0, 1.0)
    assert pre["ci95"] == list(ev.wilson(0, 2)) and post["ci95"] == list(ev.wilson(2, 2))
    assert post["by_task"] == {task.instance_id: [1.0, 1.0]} and post["tasks"] == 1
    for point in ("pre_sft", "post_sft"):
        folder = tmp_path / "run" / "eval" / point
        records = [Trajectory.from_dict(json.loads(x)) for x in (folder / "trajectories.jsonl").read_text().splitlines()]
        assert [(t.task_id, t.metadata["eval"]) for t in records] == [(task.instance_id, point)] * 2
        assert json.loads((folder / "summary.json").read_text())["successes"] == summaries[point]["successes"]
        with pytest.raises(RecordError, match="held-out evaluation episode"):
            build_samples(records, SampleConfig())
    # every call was sampled at the evaluation's temperature, not the rollout's
    assert {c.flags["sampling"]["temperature"] for t in records for c in t.calls} == {0.0}


# -- prepare: synthesis once, reused, refused when the folder was made with other settings ---------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_prepare_synthesizes_once_and_refuses_a_folder_of_other_settings(tmp_path):
    from harnessrl.trainers.loop import TrainConfig
    from harnessrl.trainers.prepare import PrepareError, prepare_data

    tasks = tmp_path / "synth"
    synth = {"project": "builtin:calc", "max_tasks": 2, "verify": False, "hard_fraction": 0.0, "heldout_fraction": 0.5}
    cfg = TrainConfig.model_validate({
        "rollout": {"suite": str(tasks / "train.jsonl"), "episode": {"wall_time_s": 300, "reward": {"test_timeout_s": 120}}},
        "eval": {"suite": str(tasks / "heldout.jsonl")}, "prepare": {"tasks_dir": str(tasks), "synth": synth}})
    lines: list[str] = []
    made = asyncio.run(prepare_data(cfg, log=lines.append))
    assert made["synth"]["made"] is True and made["synth"]["tasks"] >= 1
    rows = [json.loads(x) for f in ("train.jsonl", "heldout.jsonl") for x in (tasks / f).read_text().splitlines()]
    assert len(rows) == made["synth"]["tasks"] and all(r["instance_id"].startswith("harnessrl-synth__calc") for r in rows)
    assert asyncio.run(prepare_data(cfg, log=lines.append)) == {"synth": {"tasks_dir": str(tasks), "made": False}}
    other = cfg.model_copy(update={"prepare": cfg.prepare.model_copy(update={"synth": synth | {"seed": 1}})})
    with pytest.raises(PrepareError, match=r"synthesized with other settings \(seed: \[0\] there, \[1\] asked\)"):
        asyncio.run(prepare_data(other, log=lines.append))
