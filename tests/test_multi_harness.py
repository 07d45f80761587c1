"""Several harnesses in one run (`rollout.harnesses`): the config refuses bad names and weights,
each GRPO group runs through one harness drawn by weight with the run's seed, the step line,
metrics.jsonl, report.json and each evaluation point report per harness, and a harness whose
first prompt does not fit the context is refused before the run starts, named.

Real parts: mini-swe-agent (unmodified, from its pinned venv) and tiny-agent (the stdlib
command harness of examples/harnesses/tiny-agent.toml) in Docker sandboxes, the real proxy with
tiny-llama's tokenizer and chat template, the scripted gold policy or the tiny random-init
model on the local engine, the hidden tests.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.harness_mix import HarnessMix
from harnessrl.gym.rollout import RolloutConfig
from harnessrl.gym.scheduler import RolloutScheduler, SchedulerConfig
from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.train_config import ConfigError, load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples" / "harnesses" / "tiny-agent.toml")
TASK = "harnessrl-builtin__cachekit-2"
TWO = {"mini-swe-agent": 1.0, TINY: 1.0}


def _need_stack() -> None:
    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")


# -- the config -------------------------------------------------------------------------------
@pytest.mark.parametrize("toml, field, message", [
    ('[rollout]\nharnesses = {"mini-swe-agent" = 1, nope = 2}\n', "rollout.harnesses.nope.[key]",
     "unknown harness 'nope'; known: aider, claude-code, claude-code-agents, codex, command, gemini-cli, "
     "mini-swe-agent, opencode"),
    ('[rollout]\nharnesses = {"mini-swe-agent" = 1, codex = 0}\n', "rollout.harnesses.codex", "greater than 0"),
    ('[rollout]\nharnesses = {codex = -2.5}\n', "rollout.harnesses.codex", "greater than 0"),
    ('[rollout]\nharnesses = ["codex", "aider", "codex"]\n', "rollout.harnesses", "['codex'] named twice"),
    ('[rollout]\nharnesses = []\n', "rollout", "empty; name at least one harness"),
    ('[rollout]\nharness = "aider"\nharnesses = ["codex", "opencode"]\n', "rollout",
     "'aider' is not among rollout.harnesses ['codex', 'opencode']"),
])
def test_bad_harnesses_are_refused_naming_the_field(tmp_path, toml, field, message):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    line = next(x for x in str(e.value).splitlines() if x.strip().startswith(field + ":"))
    assert message in line, str(e.value)


def test_harnesses_as_weights_or_a_list_and_harness_alone_unchanged(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[scheduler]\nepisode_timeout_s = 3600\n[rollout]\nseed = 7\n'
                    f'[rollout.harnesses]\n"mini-swe-agent" = 3\n"{TINY}" = 1.5\n')
    r = load_config(path).rollout
    assert r.harness_weights == {"mini-swe-agent": 3.0, TINY: 1.5} and r.seed == 7
    assert r.harness == "mini-swe-agent"  # the run's first harness, for one-harness tools
    again = RolloutConfig.model_validate(json.loads(r.model_dump_json()))  # config.json reloads as it was
    assert again.harness_weights == r.harness_weights and again.harness == "mini-swe-agent"
    assert RolloutConfig(harnesses=["codex", "aider"]).harness_weights == {"codex": 1.0, "aider": 1.0}
    assert RolloutConfig(harness="aider").harness_weights == {"aider": 1.0}


@pytest.mark.parametrize("toml, message", [
    ('[rollout]\nharness = "codex"\n[rollout.harness_options]\ncodex = {auto_compact = 3}\n',
     "rollout.harness_options.codex: no option 'auto_compact'; its adapter takes ['auto_compact_tokens']"),
    ('[rollout]\nharnesses = ["codex", "aider"]\n[rollout.harness_options]\nopencode = {context = 8192}\n',
     "rollout.harness_options: 'opencode' is not one of this run's harnesses ['codex', 'aider']"),
    (f'[rollout]\nharness = "{TINY}"\n[rollout.harness_options."{TINY}"]\nx = 1\n',
     "is a command-adapter config: set its options in that file"),
])
def test_harness_options_are_refused_naming_the_option_and_the_valid_ones(tmp_path, toml, message):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value)


def test_harness_options_reach_each_harness_s_adapter(tmp_path):
    """The compaction thresholds of OpenCode and Codex are run-config keys: each run's adapter
    is built with them (the stack builds every adapter of the run)."""
    from harnessrl.gym.stack import EpisodeStack

    path = tmp_path / "c.toml"
    path.write_text('[scheduler]\nepisode_timeout_s = 3600\n[rollout]\nharnesses = ["opencode", "codex", "aider"]\nsandbox_pool_size = 0\n'
                    '[rollout.harness_options]\nopencode = {context = 8192, output = 400}\n'
                    'codex = {auto_compact_tokens = 7400}\n')
    cfg = load_config(path).rollout
    stack = EpisodeStack(cfg, tasks=[], sandbox_backend=object())
    oc, cx = stack.adapter_for("opencode"), stack.adapter_for("codex")
    assert (oc.context, oc.output, cx.auto_compact_tokens) == (8192, 400, 7400)
    plain = EpisodeStack(RolloutConfig(harnesses=["opencode", "codex"], sandbox_pool_size=0), tasks=[],
                         sandbox_backend=object())
    assert (plain.adapter_for("opencode").context, plain.adapter_for("codex").auto_compact_tokens) == (32768, None)
    again = RolloutConfig.model_validate(json.loads(cfg.model_dump_json()))  # config.json reloads as it was
    assert again.harness_options == {"opencode": {"context": 8192, "output": 400}, "codex": {"auto_compact_tokens": 7400}}


def test_the_draw_is_by_weight_and_the_same_under_the_same_seed():
    a, b, c = (HarnessMix({"x": 3, "y": 1}, seed) for seed in (11, 11, 12))
    ahead = a.peek(400)
    seq = [a.draw() for _ in range(400)]
    assert seq == ahead == [b.draw() for _ in range(400)]  # peek takes nothing; same seed, same draws
    assert seq != [c.draw() for _ in range(400)]
    n = Counter(seq)
    assert n == Counter(a.drawn) and sum(n.values()) == 400
    assert 270 <= n["x"] <= 330  # 3:1 -> 300 expected; 6 standard deviations (8.7) either way
    one = HarnessMix({"only": 2.0}, 5)
    state = one._rng.getstate()
    assert [one.draw() for _ in range(5)] == ["only"] * 5 and one._rng.getstate() == state  # no randomness used
    with pytest.raises(ValueError, match="weight of 'y' is 0"):
        HarnessMix({"x": 1, "y": 0})


def test_each_group_has_one_harness_kept_on_requeue_and_in_the_scheduler_s_own_records():
    """The scheduler draws once per new group: every episode of the group is handed that harness,
    the records it writes itself (an episode that raised) carry it, and a group dropped for
    staleness and rerun keeps it."""
    mix = HarnessMix({"a": 1.0, "b": 2.0}, seed=3)
    expected = mix.peek(6)

    async def episode(slot) -> Trajectory:
        if slot.group_id == 1 and slot.index == 0:
            raise RuntimeError("the sandbox broke")
        return Trajectory(session_id=f"{slot.group_id}-{slot.index}", segments=[], reward=1.0, status="ok",
                          task_id=slot.task_id, harness=slot.harness)

    async def run() -> list[Trajectory]:
        sched = RolloutScheduler(SchedulerConfig(env_pool_size=4, group_size=3, groups_per_step=2, staleness=0),
                                 episode, [f"t{i}" for i in range(6)], harness_for=mix)
        await sched.start()
        out = []
        for _ in range(3):
            out += await sched.next_batch()
            await sched.advance_version()
        await sched.close()
        return out

    trajs = asyncio.run(run())
    groups: dict[int, set[str]] = {}
    for t in trajs:
        groups.setdefault(t.metadata["group_id"], set()).add(t.harness)
        assert t.metadata["group_harness"] == t.harness
    assert len(trajs) == 18 and all(len(h) == 1 for h in groups.values())
    assert [groups[g].pop() for g in sorted(groups)] == expected  # group k got the k-th draw
    broke = next(t for t in trajs if t.status == "infra_error")
    assert broke.harness == expected[1] and broke.metadata["error"].startswith("RuntimeError: the sandbox broke")


# -- real harnesses -----------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_a_rollout_of_two_harnesses_runs_each_group_through_its_drawn_harness(tmp_path):
    """mini-swe-agent and tiny-agent on the scripted gold policy: 3 groups of 2, each group's
    episodes through one harness, the k-th group's harness the k-th draw under the seed, every
    episode solved (reward 1.0) through its harness's own tool."""
    _need_stack()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import Rollout
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tasks.loaders import load_suite

    task = next(t for t in load_suite("builtin") if t.instance_id == TASK)
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    cfg = RolloutConfig(harnesses=TWO, seed=_seed_drawing_both(3), tasks=[TASK], model="tiny-llama", sandbox="docker",
                        sandbox_pool_size=0, episode=EpisodeConfig(max_calls=8, wall_time_s=240))

    async def run(ro) -> list[Trajectory]:
        mix = HarnessMix(ro.stack.harness_weights, cfg.seed)
        sched = RolloutScheduler(SchedulerConfig(env_pool_size=2, group_size=2, groups_per_step=3, staleness=0),
                                 ro.episode, [TASK] * 3, harness_for=mix)
        await sched.start()
        try:
            return await sched.next_batch()
        finally:
            await sched.close()

    with ServedApp(engine.app()) as served, Rollout(cfg, served.url, tmp_path, tasks=[task]) as ro:
        assert sorted(ro.stack.adapters) == ["mini-swe-agent", "tiny-agent"]
        expected = HarnessMix(ro.stack.harness_weights, cfg.seed).peek(3)
        trajs = asyncio.run(run(ro))
    assert set(expected) == {"mini-swe-agent", "tiny-agent"}  # the seed was picked so
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_group.setdefault(t.metadata["group_id"], []).append(t)
    assert sorted(by_group) == [0, 1, 2] and all(len(g) == 2 for g in by_group.values())
    assert [{t.harness for t in by_group[g]} for g in range(3)] == [{h} for h in expected]
    assert [t.reward for t in trajs] == [1.0] * 6, [(t.harness, t.termination, t.metadata.get("ending")) for t in trajs]
    # each episode went through its harness: tiny-agent ends by a reply without a tool call,
    # mini-swe-agent by its submit command
    assert {t.harness: t.termination for t in trajs} == {"mini-swe-agent": "submitted", "tiny-agent": "submitted"}
    stored = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert Counter(x["harness"] for x in stored) == Counter(h for h in expected for _ in range(2))


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_evaluation_reports_each_harness_separately(tmp_path):
    """Each held-out task runs through every harness of the run; the point's summary has each
    harness's own figures and its printed line names each."""
    _need_stack()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.trainers import evaluate as ev

    task = next(t for t in load_suite("builtin") if t.instance_id == TASK)
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    base = RolloutConfig(harnesses=TWO, model="tiny-llama", sandbox="docker", sandbox_pool_size=0,
                         episode=EpisodeConfig(max_calls=8, wall_time_s=240))
    with ServedApp(engine.app()) as served:
        s = asyncio.run(ev.evaluate("post_rl", ev.EvalConfig(suite="builtin"), base, served.url, tmp_path,
                                    tasks=[task]))
    assert (s["n"], s["successes"], s["episodes"]) == (2, 2, 2)
    assert sorted(s["by_harness"]) == ["mini-swe-agent", "tiny-agent"]
    for name, sub in s["by_harness"].items():
        assert (sub["n"], sub["successes"], sub["success_rate"], sub["reward_mean"]) == (1, 1, 1.0, 1.0), name
        assert sub["by_task"] == {TASK: [1.0]}
    lines = ev.line(s).splitlines()
    assert len(lines) == 3 and lines[1].strip().startswith("mini-swe-agent: success 1/1")
    assert lines[2].strip().startswith("tiny-agent: success 1/1")
    saved = json.loads((tmp_path / "eval" / "post_rl" / "summary.json").read_text())
    assert saved["by_harness"]["tiny-agent"]["successes"] == 1

    # a run trained through mini-swe-agent alone: tiny-agent is its transfer harness, evaluated
    # with its own k (here 0: the greedy episode only), mini-swe-agent with the run's k = 2
    trained = base.model_copy(update={"harness": "mini-swe-agent", "harnesses": None})
    cfg = ev.EvalConfig(suite="builtin", harnesses=list(TWO), episodes_per_task=2, greedy=True, transfer_episodes_per_task=0)
    with ServedApp(engine.app()) as served:
        s = asyncio.run(ev.evaluate("post_sft", cfg, trained, served.url, tmp_path, tasks=[task]))
    mini, tiny = s["by_harness"]["mini-swe-agent"], s["by_harness"]["tiny-agent"]
    assert (mini["n"], mini["successes"], mini["samples_per_task"], mini["greedy"]["n"]) == (2, 2, 2, 1)
    assert (tiny["n"], tiny["samples_per_task"], tiny["pass_at_1"]) == (0, 0, None)
    assert (tiny["greedy"]["n"], tiny["greedy"]["by_task"]) == (1, {TASK: 1})
    assert ev.line(s).splitlines()[2].strip() == (
        "tiny-agent: greedy only: success 1/1 = 1.00 (95% CI 0.21-1.00)  failed: none")
    records = (tmp_path / "eval" / "post_sft" / "trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["harness"] for x in records) == ["mini-swe-agent"] * 2


def _train_cfg(tmp_path: Path, **rollout):
    from harnessrl.trainers.loop import TrainConfig

    return TrainConfig.model_validate({
        "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path), "progress": False, "tensorboard": False,
        "stages": ["rl"], "eval": {"points": []},
        "rollout": {"tasks": [TASK], "max_new_tokens": 32, "sandbox": "docker", "harnesses": TWO,
                    "episode": {"max_calls": 2, "wall_time_s": 180}, **rollout},
        "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 2, "staleness": 0},
        "trainer": {"lr": 1e-5, "device": "cpu"},
        "sampling": {"zero_variance": "keep"},  # the tiny model scores 0 everywhere: train on it anyway
    })


def _seed_drawing_both(groups: int = 2) -> int:
    """A seed whose first `groups` groups draw both harnesses (2: one group of each)."""
    return next(s for s in range(100) if set(HarnessMix({"mini-swe-agent": 1, "tiny-agent": 1}, s).peek(groups))
                == {"mini-swe-agent", "tiny-agent"})


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_train_with_two_harnesses_reports_each_in_metrics_and_report(tmp_path, capsys):
    _need_stack()
    from harnessrl.trainers.loop import train

    seed = _seed_drawing_both()
    history = asyncio.run(train(_train_cfg(tmp_path, seed=seed)))
    (m,) = history
    figs = m["harnesses"]
    assert sorted(figs) == ["mini-swe-agent", "tiny-agent"]
    for name, x in figs.items():
        assert (x["episodes"], x["groups"]) == (2, 1), (name, x)
        assert x["masked_infra"] + (x["reward_mean"] is not None) >= 1
        assert x["failures"] == x["masked_infra"] + x["harness_errors"]
    assert sum(x["completion_tokens"] for x in figs.values()) == m["batch_report"]["completion_tokens"]
    scored = [x for x in figs.values() if x["reward_mean"] is not None]
    assert all(x["reward_mean"] == 0.0 and x["success_rate"] == 0.0 for x in scored)  # random init solves nothing
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert line["harnesses"] == figs
    out = capsys.readouterr().out
    assert re.search(r"\[mini-swe-agent [-0-9.]+/[-0-9.]+ \(2 ep.*\)  tiny-agent [-0-9.]+/[-0-9.]+ \(2 ep", out), out
    run = json.loads((tmp_path / "report.json").read_text())
    for name, x in run["harnesses"].items():
        assert x["episodes"] == figs[name]["episodes"] and x["completion_tokens"] == figs[name]["completion_tokens"]
        assert x["weight"] == 1.0 and x["groups_drawn"] >= 1
    sizes = run["context"]["first_prompt_tokens"]
    assert run["context"]["length"] == 8192 and sorted(sizes) == ["mini-swe-agent", "tiny-agent"]
    assert all(0 < n < 8192 for n in sizes.values())
    # every stored episode says which harness made it
    stored = [json.loads(x) for x in (tmp_path / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    assert {x["harness"] for x in stored} == {"mini-swe-agent", "tiny-agent"}


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_a_harness_whose_first_prompt_does_not_fit_is_refused_before_the_run_naming_it(tmp_path):
    """The probe measures each harness's first prompt with the model's tokenizer and template;
    with a context between tiny-agent's and mini-swe-agent's, train refuses mini-swe-agent,
    named with its count, before any engine, trainer or episode starts."""
    _need_stack()
    from harnessrl.gym.context_probe import ContextTooLong, check_context
    from harnessrl.gym.stack import load_suite_tasks
    from harnessrl.trainers.loop import train

    cfg = _train_cfg(tmp_path / "probe")
    rollout = cfg.rollout.model_copy(update={"model": "tiny-llama"})
    sizes = asyncio.run(check_context(rollout, load_suite_tasks(rollout), 10**6))
    assert sorted(sizes) == ["mini-swe-agent", "tiny-agent"] and sizes["tiny-agent"] < sizes["mini-swe-agent"]
    context = sizes["tiny-agent"] + 1  # tiny-agent fits with room for one token; mini-swe-agent does not
    out = tmp_path / "run"
    with pytest.raises(ContextTooLong) as e:
        asyncio.run(train(_train_cfg(out, context_length=context)))
    msg = str(e.value)
    found = re.search(rf"harness 'mini-swe-agent': its first prompt is (\d+) tokens, the context is {context}", msg)
    assert found and int(found.group(1)) >= context, msg
    assert "tiny-agent" not in msg and f"task {TASK}" in msg
    assert not (out / "metrics.jsonl").exists() and not (out / "weights").exists()
    assert not (out / "rollouts").exists()  # no episode of the run started


# -- transfer: the held-out tasks through a harness the run did not train with ------------------------
def test_eval_harnesses_override_the_run_s_harness_and_are_checked():
    from harnessrl.trainers import evaluate as ev

    base = RolloutConfig(harness="mini-swe-agent", temperature=0.7)
    two = ev.rollout_config(ev.EvalConfig(suite="fix-heldout", harnesses=["mini-swe-agent", "aider"]), base)
    assert two.harness_weights == {"mini-swe-agent": 1.0, "aider": 1.0} and two.temperature == 0.7
    one = ev.rollout_config(ev.EvalConfig(suite="fix-heldout", harnesses=["aider"]), base)
    assert (one.harness, one.harnesses) == ("aider", None)
    assert ev.rollout_config(ev.EvalConfig(suite="fix-heldout"), base).harness_weights == {"mini-swe-agent": 1.0}
    for bad, msg in ((["nope"], "unknown harness 'nope'"), (["aider", "aider"], "none twice"), ([], "at least one")):
        with pytest.raises(ValueError, match=msg):
            ev.EvalConfig(suite="x", harnesses=bad)
    with pytest.raises(ValueError, match="eval.greedy"):
        ev.EvalConfig(suite="x", temperature=0.0, greedy=True)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(1200)
def test_transfer_eval_reports_k_samples_greedy_and_paired_tests_per_harness(tmp_path):
    """A run trained through mini-swe-agent evaluated through it and through tiny-agent: k = 2
    sampled episodes plus one greedy per task and harness, at two points (the scripted policy
    fails, then solves); each harness's pass@1, greedy figures and paired tests are its own."""
    _need_stack()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.trainers import evaluate as ev
    from harnessrl.trainers.eval_stats import paired_points

    task = next(t for t in load_suite("builtin") if t.instance_id == TASK)
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    base = RolloutConfig(harness="mini-swe-agent", model="tiny-llama", sandbox="docker", sandbox_pool_size=0,
                         temperature=0.7, episode=EpisodeConfig(max_calls=8, wall_time_s=240))
    cfg = ev.EvalConfig(suite="builtin", harnesses=["mini-swe-agent", TINY], episodes_per_task=2, greedy=True,
                        concurrency=2)
    evals = {}
    with ServedApp(engine.app()) as served:
        for point, gold in (("post_sft", False), ("post_rl", True)):
            engine.set_tasks([task], gold=gold)
            evals[point] = asyncio.run(ev.evaluate(point, cfg, base, served.url, tmp_path, tasks=[task]))
    pre, post = evals["post_sft"], evals["post_rl"]
    assert (pre["n"], pre["successes"], pre["pass_at_1"]) == (4, 0, 0.0)
    assert (post["n"], post["successes"], post["pass_at_1"], post["pass_at_1_ci95"]) == (4, 4, 1.0, [1.0, 1.0])
    assert post["samples_per_task"] == 2 and post["greedy"]["by_task"] == {TASK: 1} and pre["greedy"]["by_task"] == {TASK: 0}
    for h in ("mini-swe-agent", "tiny-agent"):
        assert post["by_harness"][h]["by_task"] == {TASK: [1.0, 1.0]} and post["by_harness"][h]["greedy"]["n"] == 1
        assert pre["by_harness"][h]["greedy"]["by_task"] == {TASK: 0}
    paired = paired_points(evals, ev.POINTS)["post_sft->post_rl"]
    assert (paired["tasks"], paired["better"], paired["pass_at_1_diff"], paired["permutation_p"]) == (1, 1, 1.0, 1.0)
    assert paired["greedy_mcnemar"] == {"tasks": 1, "fail_to_pass": 1, "pass_to_fail": 0, "p": 1.0}
    assert sorted(paired["by_harness"]) == ["mini-swe-agent", "tiny-agent"]
    folder = tmp_path / "eval" / "post_rl"
    sampled = [Trajectory.from_dict(json.loads(x)) for x in (folder / "trajectories.jsonl").read_text().splitlines()]
    greedy = [Trajectory.from_dict(json.loads(x)) for x in (folder / "greedy" / "trajectories.jsonl").read_text().splitlines()]
    assert Counter(t.harness for t in sampled) == {"mini-swe-agent": 2, "tiny-agent": 2}
    assert Counter(t.harness for t in greedy) == {"mini-swe-agent": 1, "tiny-agent": 1}
    assert {c.flags["sampling"]["temperature"] for t in sampled for c in t.calls} == {0.7}
    assert {c.flags["sampling"]["temperature"] for t in greedy for c in t.calls} == {0.0}
    lines = ev.line(post).splitlines()
    assert "pass@1 1.000 (95% CI 1.00-1.00, 2 a task)  greedy 2/2" in lines[0]
    assert [x.split(":")[0].strip() for x in lines[1:]] == ["mini-swe-agent", "tiny-agent"]
    assert all("pass@1 1.000 (95% CI 1.00-1.00, 2 a task)  greedy 1/1" in x for x in lines[1:])
