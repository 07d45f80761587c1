"""bench/learning_curve.py's verdict and the harder level's config, on hand-made run reports.

The bench's runs take an hour and more (docs/learning-run.md); what is tested here is what it
concludes from their reports: the main job's reward rise, each point's pass@1 and greedy figures
per harness, the pooled paired test over seeds on the harness the policy trained through, and
target_met. The reports are shaped as `trainers.evaluate.summarize` writes them (built by it here).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from harnessrl.trainers.eval_stats import paired_points, pass_at_1
from harnessrl.trainers.train_config import load_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import learning_curve as lc  # noqa: E402

TASKS = [f"t{i}" for i in range(8)]


def _point(rates: dict[str, float], greedy: dict[str, int], k: int = 4) -> dict:
    """A summary of k samples per task with these success shares (as `summarize` reports it)."""
    by_task = {t: [1.0] * round(r * k) + [0.0] * (k - round(r * k)) for t, r in rates.items()}
    n, s = k * len(rates), sum(round(r * k) for r in rates.values())
    p1, ci = pass_at_1(by_task)
    return {"n": n, "successes": s, "success_rate": s / n, "by_task": by_task, "pass_at_1": p1,
            "pass_at_1_ci95": ci, "greedy": {"n": len(greedy), "successes": sum(greedy.values()), "by_task": greedy}}


def _run(seed: int, sft: dict, rl: dict, transfer_rl: dict | None = None) -> dict:
    evals = {"post_sft": _point(sft, {t: int(r >= 0.5) for t, r in sft.items()}),
             "post_rl": _point(rl, {t: int(r >= 0.5) for t, r in rl.items()})}
    if transfer_rl is not None:  # the same held-out tasks through a harness it did not train with
        for p, rates in (("post_sft", sft), ("post_rl", transfer_rl)):
            evals[p]["by_harness"] = {"mini-swe-agent": dict(evals[p]), "aider": _point(rates, {t: 0 for t in rates})}
    report = {"eval": evals, "eval_paired": paired_points(evals, ("pre_sft", "post_sft", "post_rl"))}
    return lc.run_of(seed, 600.0, report, [{"reward_mean": x, "grad_norm": 0.5} for x in (0.1, 0.2, 0.5, 0.6)],
                     "mini-swe-agent")


def _args(quick=False):
    return argparse.Namespace(config="examples/learn-harder.toml", main="default", seeds=[0, 1], quick=quick)


def test_a_greedy_only_transfer_point_shows_its_greedy_count():
    assert lc._fmt({"n": 0, "successes": 0, "greedy": {"n": 8, "successes": 2}}) == "greedy only: g 2/8"
    assert lc._fmt({"n": 0, "successes": 0}) == lc._fmt(None) == "-"


def test_reward_rises_compares_halves_and_needs_a_gradient():
    assert lc.reward_rises([0.1, 0.2, 0.5, 0.6], [0.3, 0.0, 0.2, 0.1])
    assert not lc.reward_rises([0.5, 0.6, 0.1, 0.2], [0.3] * 4)
    assert not lc.reward_rises([0.1, 0.9], [0.0, None])  # nothing trained: no rise, whatever the reward
    assert lc.reward_rises([0.0, None, 0.9, 0.5, 1.0], [0.1] * 5)  # a skipped step (None) is left out
    assert not lc.reward_rises([0.4], [0.1])


def test_target_met_needs_the_pooled_paired_test_on_the_trained_harness(capsys):
    sft = {t: 0.25 for t in TASKS}
    better = {t: 0.75 for t in TASKS}  # every task +0.5 in both seeds: exact p = 2 / 2^8
    runs = [_run(0, sft, better, transfer_rl=sft), _run(1, sft, better, transfer_rl=sft)]
    main = [lc.run_of(s, 300.0, {}, [{"reward_mean": x, "grad_norm": 0.4} for x in (0.1, 0.5)], "m") for s in (0, 1)]
    v = lc.verdict(main, runs, 3000.0, 4000.0, _args())
    pooled = v["level"]["pooled"]
    assert pooled["mini-swe-agent"] == {"tasks": 8, "pass_at_1_diff": 0.5, "permutation_p": 2 / 256, "sign_p": 2 / 256}
    assert pooled["aider"]["pass_at_1_diff"] == 0.0 and pooled["aider"]["permutation_p"] == 1.0  # transfer: no change
    assert v["main"]["reward_rises"] and v["level"]["rl_above_sft"] and v["target_met"]
    seed0 = v["level"]["per_seed"][0]
    assert seed0["post_rl"]["mini-swe-agent"] == {"n": 32, "successes": 24, "pass_at_1": 0.75,
                                                  "pass_at_1_ci95": [0.75, 0.75], "greedy": 8}
    assert seed0["paired"][lc.PAIR]["greedy_mcnemar"] == {"tasks": 8, "fail_to_pass": 8, "pass_to_fail": 0,
                                                          "p": 2 / 256}
    out = capsys.readouterr().out
    assert "[aider (transfer)]" in out and "[mini-swe-agent (trained)]" in out and "target NOT met" not in out
    # the same numbers over budget, or as a --quick trial, or with a flat main job: not met, and said why
    assert not lc.verdict(main, runs, lc.BUDGET_S + 1, 9e3, _args())["target_met"]
    assert not lc.verdict(main, runs, 3000.0, 4000.0, _args(quick=True))["target_met"]
    flat = [lc.run_of(0, 1.0, {}, [{"reward_mean": 0.5, "grad_norm": 0.4}] * 2, "m")]
    assert not lc.verdict(flat, runs, 3000.0, 4000.0, _args())["target_met"]
    assert "the main job's reward did not rise" in capsys.readouterr().out


def test_a_gain_on_few_tasks_is_not_significant(capsys):
    sft = {t: 0.25 for t in TASKS}
    rl = dict(sft) | {"t0": 1.0, "t1": 1.0, "t2": 0.5}  # 3 tasks better, 5 unchanged: p = 2 / 8
    v = lc.verdict([], [_run(0, sft, rl), _run(1, sft, rl)], 3000.0, 3000.0, _args())
    run = v["level"]["pooled"]["run"]
    assert run["tasks"] == 8 and run["permutation_p"] == 0.25 and run["pass_at_1_diff"] == pytest.approx(1.75 / 8)
    assert not v["level"]["rl_above_sft"] and not v["target_met"]
    assert "paired p 0.25 (needs > 0 and p < 0.05)" in capsys.readouterr().out


def test_the_harder_level_config_holds_what_the_issue_asks():
    cfg = load_config(ROOT / "examples" / "learn-harder.toml")
    synth = cfg.prepare.synth_config()
    assert (synth.fix_only, synth.fix_hint, synth.split_by) == (True, "prose", "file")
    assert cfg.eval.episodes_per_task >= 4 and cfg.eval.greedy and cfg.eval.temperature is None  # the run's
    assert cfg.rollout.temperature > 0 and cfg.eval.points == ["post_sft", "post_rl"]
    assert cfg.rollout.harness in cfg.eval.harnesses and len(cfg.eval.harnesses) >= 2  # a harness it never trained with
    assert cfg.sft.shuffle and cfg.eval.difficulties == cfg.rollout.difficulties == ["easy"]
    copy = load_config(ROOT / "examples" / "learn-cpu.toml")  # the copy level stays the quick check
    assert copy.prepare.synth_config().fix_hint == "fix"


def test_resume_reads_a_finished_seed_back_and_runs_none_again(tmp_path, monkeypatch):
    """A bench killed after a seed finished resumes without running that seed again: its row
    comes from report.json and metrics.jsonl, its wall time from the files' times."""
    import json
    import os

    import harnessrl.trainers.loop as loop

    def refuse(cfg):
        raise AssertionError(f"ran {cfg.out_dir} again")
    monkeypatch.setattr(loop, "train", refuse)
    row = _run(0, {t: 0.25 for t in TASKS}, {t: 0.5 for t in TASKS})
    folder = tmp_path / "level" / "seed0"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "report.json").write_text(json.dumps({"eval": row["eval"], "eval_paired": row["paired"]}))
    steps = [{"stage": "sft", "step": 1, "loss": 0.5, "grad_norm": 1.0},
             *({"step": i, "reward_mean": r, "grad_norm": 0.4} for i, r in enumerate((0.1, 0.3), start=2))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    os.utime(folder / "config.json", (1000.0, 1000.0))
    os.utime(folder / "report.json", (1000.0 + 1234.5, 1000.0 + 1234.5))
    [got] = lc.run_job(str(ROOT / "examples" / "learn-harder.toml"), [0], tmp_path / "level", quick=False, resume=True)
    assert (got["seed"], got["wall_s"], got["rewards"], got["grad_norms"]) == (0, 1234.5, [0.1, 0.3], [0.4, 0.4])
    assert got["eval"] == row["eval"] and got["paired"] == row["paired"]
    with pytest.raises(AssertionError, match="ran .*seed1 again"):  # an unfinished seed runs again, its folder kept aside
        (tmp_path / "level" / "seed1").mkdir()
        lc.run_job(str(ROOT / "examples" / "learn-harder.toml"), [1], tmp_path / "level", quick=False, resume=True)
    assert [p.name.split(".")[0] for p in (tmp_path / "level").iterdir() if "partial" in p.name] == ["seed1"]
