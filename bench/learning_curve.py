"""Does training learn? The main job and the harder learning run, each for several trainer seeds.

    .venv/bin/python bench/learning_curve.py                       # default run + learn-harder, seeds 0 1
    .venv/bin/python bench/learning_curve.py --config examples/learn-cpu.toml --main none   # the copy level
    .venv/bin/python bench/learning_curve.py --quick               # a short trial of the pipeline

Two jobs, each one whole `harnessrl train` run per seed (its `trainer.seed` set, its own out_dir;
the data a config prepares is made by the first seed and shared, and SFT's order comes from the
seed, so seeds are independent runs on the same tasks):
- "main": the default `harnessrl train` (`--main`, default: the embedded default config). Per
  seed its RL reward per step and grad norms; `reward_rises` when the mean reward of the second
  half of the steps is above the first half's and some step trained (grad norm > 0).
- "level": the learning config (`--config`, default examples/learn-harder.toml). Per seed and
  held-out point: success k/n, pass@1 with its 95% interval, the greedy episodes, per harness
  when the config evaluates through several (transfer); between points the paired tests of
  report.json "eval_paired"; and pooled over seeds, per task the post_rl - post_sft pass@1
  difference averaged over seeds, tested by the exact paired permutation test over tasks, on
  the harness the policy trained through.
Prints the tables, then ONE JSON line with target_met: the main job's reward rises for every
seed, and the level's pooled post_rl pass@1 is above post_sft with paired p < 0.05, and the level
job takes at most 90 minutes. When it is not met it says which part failed (docs/learning-run.md
says why the 135M model on 2 cores does not reach the harder level). Nothing here tunes the
held-out set: it is whatever the config names.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POINTS = ("pre_sft", "post_sft", "post_rl")
PAIR = "post_sft->post_rl"
ALPHA, BUDGET_S = 0.05, 90 * 60


def _cfg(source: str | None, seed: int, out: Path, quick: bool):
    """The job's config for one seed; `--quick` shrinks it and moves its prepared data aside."""
    from harnessrl.trainers.loop import load_config

    cfg = load_config(source)
    update = {"out_dir": str(out / f"seed{seed}"), "progress": False, "tensorboard": False,
              "trainer": cfg.trainer.model_copy(update={"seed": seed})}
    if not quick:
        return cfg.model_copy(update=update)
    data = out.parent / f"{out.name}-quick-data"  # the pipeline end to end, not a measurement
    sft = cfg.sft.model_copy(update={"steps": 2, "data": str(data / "teacher" / "trajectories.jsonl")})
    update |= {"steps": 2, "sft": sft,
               "eval": cfg.eval.model_copy(update={"max_tasks": 2,
                                                   "episodes_per_task": min(cfg.eval.episodes_per_task, 2)}),
               "prepare": cfg.prepare.model_copy(update={"teacher_episodes": 4})}
    if cfg.prepare.tasks_dir is not None:
        update["prepare"] = update["prepare"].model_copy(update={
            "tasks_dir": str(data), "synth": cfg.prepare.synth | {"max_tasks": 25}})
        update["rollout"] = cfg.rollout.model_copy(update={"suite": str(data / "train.jsonl")})
        update["eval"] = update["eval"].model_copy(update={"suite": str(data / "heldout.jsonl")})
    return cfg.model_copy(update=update)


def run_job(source: str | None, seeds: list[int], out: Path, quick: bool, resume: bool = False) -> list[dict]:
    """One whole `train` run per seed. `resume`: a seed whose run already finished in `out` (its
    report.json is there) is read back instead of run again (its wall time from its files: the
    config written at its start, the report at its end); an unfinished one is moved aside to
    `seed<N>.partial-<time>` and run again."""
    from harnessrl.trainers.loop import train

    runs = []
    for seed in seeds:
        cfg = _cfg(source, seed, out, quick)
        folder = Path(cfg.out_dir)
        if resume and (folder / "report.json").is_file():
            print(f"== {out.name} seed {seed}: {cfg.out_dir} (finished before: read back)", flush=True)
            runs.append(read_run(seed, folder, cfg.rollout.harness))
            continue
        if resume and folder.exists():
            aside = folder.with_name(f"{folder.name}.partial-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(aside)
            print(f"== {out.name} seed {seed}: an unfinished run moved to {aside}", flush=True)
        print(f"== {out.name} seed {seed}: {cfg.out_dir}", flush=True)
        s0 = time.monotonic()
        history = asyncio.run(train(cfg))
        report = json.loads((folder / "report.json").read_text())
        runs.append(run_of(seed, time.monotonic() - s0, report, history, cfg.rollout.harness))
    return runs


def read_run(seed: int, folder: Path, trained: str) -> dict:
    """A finished run's row from its folder: report.json, the step metrics of metrics.jsonl, and
    its wall time from config.json (written at its start) to report.json (at its end)."""
    report = json.loads((folder / "report.json").read_text())
    history = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    wall = (folder / "report.json").stat().st_mtime - (folder / "config.json").stat().st_mtime
    return run_of(seed, wall, report, history, trained)


def run_of(seed: int, wall_s: float, report: dict, history: list[dict], trained: str) -> dict:
    """One seed's row from its run's report.json and RL step metrics."""
    rl = [m for m in history if "reward_mean" in m]
    return {"seed": seed, "wall_s": round(wall_s, 1), "eval": report.get("eval", {}),
            "paired": report.get("eval_paired", {}), "trained_harness": trained,
            "rewards": [m.get("reward_mean") for m in rl], "grad_norms": [m.get("grad_norm") for m in rl],
            "skipped_steps": sum(1 for m in rl if m.get("skipped"))}


# -- the main job: does the RL reward rise? ------------------------------------------------------------
def reward_rises(rewards: list[float | None], grad_norms: list[float | None]) -> bool:
    """Second half's mean reward above the first half's (odd counts: the middle step in neither),
    and at least one step with a non-zero gradient."""
    r = [x for x in rewards if x is not None]
    if len(r) < 2 or not any(g for g in grad_norms if g is not None):
        return False
    h = len(r) // 2
    return sum(r[-h:]) / h > sum(r[:h]) / h


def main_verdict(runs: list[dict]) -> dict:
    print("\nmain job (default `harnessrl train`): RL reward per step, grad norm")
    for r in runs:
        print(f"  seed {r['seed']}: reward " + " ".join("-" if x is None else f"{x:.2f}" for x in r["rewards"])
              + "  gnorm " + " ".join("-" if x is None else f"{x:.2f}" for x in r["grad_norms"])
              + f"  skipped {r['skipped_steps']}  rises {reward_rises(r['rewards'], r['grad_norms'])}"
              + f"  ({r['wall_s']:.0f}s)")
    rises = [reward_rises(r["rewards"], r["grad_norms"]) for r in runs]
    return {"per_seed": [{"seed": r["seed"], "rewards": r["rewards"], "grad_norms": r["grad_norms"], "rises": x,
                          "wall_s": r["wall_s"]} for r, x in zip(runs, rises)],
            "reward_rises": bool(runs) and all(rises)}


# -- the level: pass@1 with intervals, paired tests, transfer --------------------------------------------
def _view(s: dict | None, harness: str | None) -> dict | None:
    if s and harness and s.get("by_harness"):
        return s["by_harness"].get(harness)
    return s


def _fmt(s: dict | None) -> str:
    g = (s or {}).get("greedy")
    if s and not s.get("n") and g and g.get("n"):  # a transfer harness evaluated greedy only
        return f"greedy only: g {g['successes']}/{g['n']}"
    if not s or not s.get("n"):
        return "-"
    lo, hi = s.get("pass_at_1_ci95") or (None, None)
    g = s.get("greedy")
    return (f"{s['successes']}/{s['n']} p@1 {s['pass_at_1']:.2f} [{lo:.2f},{hi:.2f}]"
            + (f" g {g['successes']}/{g['n']}" if g and g.get("n") else ""))


def pooled(runs: list[dict], harness: str | None) -> dict:
    """Per task the post_rl - post_sft pass@1 difference averaged over seeds; the exact paired
    permutation test and the sign test over tasks."""
    from harnessrl.trainers.eval_stats import sign_flip, sign_test, task_rates

    per_task: dict[str, list[float]] = {}
    for r in runs:
        a, b = _view(r["eval"].get("post_sft"), harness), _view(r["eval"].get("post_rl"), harness)
        if not a or not b:
            continue
        ra, rb = task_rates(a.get("by_task") or {}), task_rates(b.get("by_task") or {})
        for t in set(ra) & set(rb):
            per_task.setdefault(t, []).append(rb[t] - ra[t])
    diffs = [sum(d) / len(d) for d in per_task.values()]
    return {"tasks": len(diffs), "pass_at_1_diff": sum(diffs) / len(diffs) if diffs else None,
            "permutation_p": sign_flip(diffs), "sign_p": sign_test(diffs)}


def level_verdict(runs: list[dict]) -> dict:
    from harnessrl.trainers.eval_stats import paired_line

    harnesses = sorted({h for r in runs for s in r["eval"].values() for h in (s.get("by_harness") or {})}) or [None]
    trained = runs[0]["trained_harness"] if runs else None
    print("\nlevel: held-out success k/n, pass@1 [95% CI], greedy (g) per seed and point")
    for h in harnesses:
        tag = "" if h is None else f" [{h}{' (trained)' if h == trained else ' (transfer)'}]"
        print(f"{'seed':>6}  " + "  ".join(f"{p + tag:<44}" for p in POINTS) + "  wall")
        for r in runs:
            print(f"{r['seed']:>6}  " + "  ".join(f"{_fmt(_view(r['eval'].get(p), h)):<44}" for p in POINTS)
                  + f"  {r['wall_s']:.0f}s")
    for r in runs:
        for name, c in r["paired"].items():
            print(f"  seed {r['seed']} " + paired_line(name, c))
            for h, x in (c.get("by_harness") or {}).items():
                print(f"    {h}: " + paired_line(name, x))
    primary = trained if trained in harnesses else None
    pool = {h or "run": pooled(runs, h) for h in harnesses}
    main = pool[primary or "run"]
    for name, c in pool.items():
        if c["tasks"]:
            print(f"  pooled over seeds [{name}]: post_rl - post_sft pass@1 {100 * c['pass_at_1_diff']:+.1f} points over "
                  f"{c['tasks']} tasks, paired permutation p {c['permutation_p']:.3g}, sign p {c['sign_p']:.3g}")
    per_seed = [{"seed": r["seed"], "wall_s": r["wall_s"],
                 **{p: {h or "run": {k: (_view(r["eval"].get(p), h) or {}).get(k) for k in
                                     ("n", "successes", "pass_at_1", "pass_at_1_ci95")}
                        | {"greedy": ((_view(r["eval"].get(p), h) or {}).get("greedy") or {}).get("successes")}
                        for h in harnesses} for p in POINTS if p in r["eval"]},
                 "paired": r["paired"]} for r in runs]
    above = main["pass_at_1_diff"] is not None and main["pass_at_1_diff"] > 0 and main["permutation_p"] < ALPHA
    return {"per_seed": per_seed, "pooled": pool, "trained_harness": trained, "rl_above_sft": above}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "learn-harder.toml"), help="the level's config")
    p.add_argument("--main", default="default", help="the main job's config: 'default' (the embedded one), a "
                   "path, or 'none' to skip it")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default="runs/bench-learning")
    p.add_argument("--quick", action="store_true",
                   help="2 RL steps, 2 SFT steps, 2 held-out tasks, small prepared data: a trial only")
    p.add_argument("--resume", action="store_true",
                   help="read back the seeds whose runs finished in --out; run only the others")
    a = p.parse_args(argv)
    if len(a.seeds) < 2 and not a.quick:
        print("learning_curve: --seeds needs at least 2 seeds", file=sys.stderr)
        return 2
    out, t0 = Path(a.out), time.monotonic()
    level_runs = run_job(a.config, a.seeds, out / "level", a.quick, a.resume)
    # resumed: the level's seeds' own wall times (read back ones from their files), not this process's
    level_wall = sum(r["wall_s"] for r in level_runs) if a.resume else time.monotonic() - t0
    main_runs = [] if a.main == "none" else run_job(None if a.main == "default" else a.main, a.seeds,
                                                    out / "main", a.quick, a.resume)
    print(json.dumps(verdict(main_runs, level_runs, level_wall, time.monotonic() - t0, a)))
    return 0


def verdict(main_runs: list[dict], level_runs: list[dict], level_wall: float, wall: float, a) -> dict:
    """Print the tables; return the JSON line's fields (module doc)."""
    m = main_verdict(main_runs) if main_runs else None
    lv = level_verdict(level_runs)
    met = bool((m is None or m["reward_rises"]) and lv["rl_above_sft"] and level_wall <= BUDGET_S and not a.quick)
    if not met:
        pool = lv["pooled"][lv["trained_harness"] if lv["trained_harness"] in lv["pooled"] else "run"]
        print("target NOT met: " + "; ".join(x for x in (
            None if m is None or m["reward_rises"] else "the main job's reward did not rise for every seed",
            None if lv["rl_above_sft"] else (
                "level: no post_sft/post_rl pair scored" if pool["pass_at_1_diff"] is None else
                f"level: post_rl - post_sft pass@1 {100 * pool['pass_at_1_diff']:+.1f} points, paired p "
                f"{pool['permutation_p']:.3g} (needs > 0 and p < {ALPHA})"),
            None if level_wall <= BUDGET_S else f"level wall {level_wall:.0f}s > {BUDGET_S}s",
            "--quick is a trial, not a measurement" if a.quick else None) if x))
    return {"bench": "learning_curve", "config": a.config, "main_config": a.main, "seeds": a.seeds, "quick": a.quick,
            "main": m, "level": lv, "level_wall_s": round(level_wall, 1), "wall_s": round(wall, 1),
            "budget_s": BUDGET_S, "alpha": ALPHA, "target_met": met}


if __name__ == "__main__":
    sys.exit(main())
