"""The default `harnessrl train`: the shipped fix-level task set it trains and evaluates on, its
config, and its warm-start path (teacher episodes through the real harness -> SFT -> held-out
evaluation) on something small."""
from __future__ import annotations

import asyncio
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

from harnessrl.gym.tasks import suites
from harnessrl.gym.tasks.loaders import load_suite, suite_meta
from harnessrl.gym.tasks.suites import fixlevel
from harnessrl.trainers import evaluate as ev
from harnessrl.trainers.train_config import DEFAULT_TEACHER_DATA, TrainConfig, documented_config

ROOT = Path(__file__).resolve().parents[1]
SED = re.compile(r"^sed -i '(\d+)s/.+/.*/' \S+\.py$")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- the shipped task set -------------------------------------------------------------------------
def test_the_shipped_fix_level_set_is_what_its_manifest_says():
    manifest = json.loads((fixlevel.SUITE_DIR / "manifest.json").read_text())
    train, held = load_suite("fix-train"), load_suite("fix-heldout")
    assert manifest["verified"] is True and manifest["config"]["fix_only"] is True
    assert (manifest["config"]["seed"], manifest["config"]["max_tasks"]) == (0, 50)
    assert manifest["by_split"] == {"train": len(train), "heldout": len(held)} and len(held) >= 8
    meta = {m["instance_id"]: m for m in _rows(fixlevel.META_FILE)}
    assert set(meta) == {t.instance_id for t in train + held}
    for t in train + held:
        m = meta[t.instance_id]
        assert m["verified"] is True and m["hint"] == "fix" and t.difficulty == "trivial"
        assert m["split"] == ("train" if t in train else "heldout")
        # the fix level: the one gold command is a sed -i, shown verbatim in the statement
        [cmd] = t.gold_plan
        assert SED.match(cmd) and f"```bash\n{cmd}\n```" in t.problem_statement
        assert Path(t.source).is_file() and Path(t.source).parent == fixlevel.SUITE_DIR / "repos"


def test_held_out_tasks_share_no_id_patch_or_function_with_training_tasks(tmp_path):
    train, held = load_suite("fix-train"), load_suite("fix-heldout")
    assert suite_meta("fix-train") == suite_meta("fix-heldout") == fixlevel.META_FILE
    assert suite_meta("builtin") is None  # a suite that ships no meta.jsonl
    ev.guard_disjoint(train, held, [], ev.meta_beside("fix-train"), ev.meta_beside("fix-heldout"))
    functions = {split: {tuple(f) for m in _rows(fixlevel.META_FILE) if m["split"] == split for f in m["functions"]}
                 for split in ("train", "heldout")}
    assert functions["train"] and functions["heldout"] and not functions["train"] & functions["heldout"]
    # The guard reads that meta: a training task (new id, new patch) mutating a held-out
    # task's function is refused.
    twin = held[0].model_copy(update={"instance_id": "twin", "patch": "other"})
    meta = tmp_path / "meta.jsonl"
    row = next(m for m in _rows(fixlevel.META_FILE) if m["instance_id"] == held[0].instance_id)
    meta.write_text(fixlevel.META_FILE.read_text() + json.dumps(row | {"instance_id": "twin", "split": "train"}) + "\n")
    with pytest.raises(ev.LeakError, match=f"mutate function\\(s\\) that RL tasks mutate: \\['{'/'.join(row['functions'][0])}'\\]"):
        ev.guard_disjoint(train + [twin], held, [], meta, meta)


def test_the_fix_level_set_is_registered_and_the_builtin_one_untouched():
    from harnessrl.gym.tasks.loaders import SUITES

    assert SUITES["fix-train"] == "harnessrl.gym.tasks.suites.fixlevel:train"
    assert SUITES["fix-heldout"] == "harnessrl.gym.tasks.suites.fixlevel:heldout"
    assert Path(suites.__file__).resolve().parent / "fixlevel" == fixlevel.SUITE_DIR


# -- the default config ---------------------------------------------------------------------------
def test_the_default_is_a_teacher_warm_start_then_rl_with_held_out_points():
    cfg = TrainConfig()
    assert cfg.stages == ["sft", "rl"] and cfg.model == "smollm2-135m"
    assert (cfg.rollout.suite, cfg.eval.suite) == ("fix-train", "fix-heldout")
    assert cfg.sft.data == DEFAULT_TEACHER_DATA and cfg.prepare.teacher_episodes > 0 and cfg.prepare.tasks_dir is None
    assert cfg.eval.points_for(cfg.stages) == ["post_sft", "post_rl"] and cfg.eval.temperature == 0.0
    assert cfg.rollout.temperature > 0 and cfg.scheduler.group_size >= 2  # GRPO needs a spread within a group
    held = ev.eval_task_ids(cfg.eval, cfg.rollout)
    assert held == sorted(t.instance_id for t in load_suite("fix-heldout"))  # every held-out task, each point
    assert {i.split("__")[1].split("-")[0] for i in held} == {"cachekit", "ledger", "spans", "textkit"}


def test_the_default_teacher_episodes_spread_over_every_training_project():
    from harnessrl.trainers.prepare import spread

    cfg, train = TrainConfig(), load_suite("fix-train")
    picked = spread(train, cfg.prepare.teacher_episodes)
    ids = sorted(t.instance_id for t in train)
    assert sorted(t.instance_id for t in picked) == [ids[i * len(ids) // len(picked)] for i in range(len(picked))]
    assert len(picked) == cfg.prepare.teacher_episodes and cfg.prepare.teacher_spread
    assert {t.instance_id.split("__")[1].split("-")[0] for t in picked} == {"cachekit", "calc", "ledger", "spans", "textkit"}
    assert spread(train, len(train) + 5) == train


def test_examples_train_toml_is_the_printed_default_config():
    """examples/train.toml documents the defaults field by field: it is exactly what
    `harnessrl train --print-config` prints (regenerate it with that command)."""
    text = (ROOT / "examples" / "train.toml").read_text()
    assert text == documented_config()
    assert TrainConfig.model_validate(tomllib.loads(text)) == TrainConfig()


def test_an_rl_only_config_without_an_eval_section_is_told_how_to_turn_evaluation_off():
    with pytest.raises(ValueError, match=r"stages \['rl'\] do not reach \['post_sft'\] \(eval.points = \[\] evaluates"):
        TrainConfig(stages=["rl"])
    assert not TrainConfig(stages=["rl"], eval={"points": []}).eval.enabled


# -- the warm-start path, small: teacher episodes -> SFT -> a held-out point ------------------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_default_warm_start_collects_teachers_on_training_tasks_only_then_sfts(tmp_path, capsys):
    """The default config with a tiny model and fewer episodes: `train` collects scripted
    gold-teacher episodes through mini-swe-agent in Docker on *training* tasks, SFTs on them,
    and evaluates a held-out task no teacher episode touched."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from adapter_helpers import docker_backend

    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.trainers.loop import train

    backend = docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    d = TrainConfig().model_dump()
    d.update(model="tiny-llama", out_dir=str(tmp_path / "run"), stages=["sft"], progress=False, tensorboard=False)
    d["sft"].update(data=str(tmp_path / "teacher" / "trajectories.jsonl"), steps=2)
    d["prepare"]["teacher_episodes"] = 2
    d["eval"].update(max_tasks=1, points=["post_sft"])
    d["rollout"]["sandbox"] = "docker"
    d["trainer"].update(device="cpu", trainable_layers=1)
    cfg = TrainConfig.model_validate(d)
    try:
        history = asyncio.run(train(cfg))
    finally:
        backend.reap(run_id=backend.run_id)
    train_tasks = {t.instance_id: t for t in load_suite("fix-train")}
    held_ids = {t.instance_id for t in load_suite("fix-heldout")}
    records = _rows(tmp_path / "teacher" / "trajectories.jsonl")
    assert len(records) == 2 and len({r["task_id"] for r in records}) == 2
    for r in records:
        assert r["task_id"] in train_tasks and r["task_id"] not in held_ids
        assert r["reward"] == 1.0 and r["metadata"]["teacher"] == "scripted"
        assert all(c["flags"].get("teacher") for c in r["calls"])
    # SFT: both steps on those two teacher episodes (batch_size 2), a gradient each, new versions
    assert [(m["stage"], m["version"], m["trajectories"]) for m in history] == [("sft", 1, 2), ("sft", 2, 2)]
    assert all(m["grad_norm"] > 0 and m["tokens"] > 0 for m in history)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["prepare"]["collect"]["kept"] == 2 and report["prepare"]["collect"]["episodes"] == 2
    [point] = report["eval"].values()
    assert point["point"] == "post_sft" and point["version"] == 2 and point["episodes"] == 1
    evaluated = _rows(tmp_path / "run" / "eval" / "post_sft" / "trajectories.jsonl")
    assert len(evaluated) == 1 and evaluated[0]["task_id"] in held_ids and evaluated[0]["metadata"]["eval"] == "post_sft"
    assert "eval post_sft" in capsys.readouterr().out
