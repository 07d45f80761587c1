"""Does the learning run learn? The learning config for several trainer seeds, side by side.

    .venv/bin/python bench/learning_curve.py                      # examples/learn-cpu.toml, seeds 0 1
    .venv/bin/python bench/learning_curve.py --seeds 0 1 2 --config my.toml
    .venv/bin/python bench/learning_curve.py --quick              # a short trial of the pipeline

Each seed is one whole `harnessrl train` run of the config (its `trainer.seed` set, its own
out_dir); the data the config prepares (synthesized tasks, teacher episodes) is made by the
first run and shared by the others, so seeds differ in the trainer's initialization order and
in sampling, not in the tasks. Prints held-out success before SFT, after SFT and after RL per
seed (with the 95% Wilson interval) and the means, wall time, and why evaluation episodes
failed (counts from the records, summed over seeds), then ONE JSON line:
target_met = mean post_sft >= mean pre_sft + 20 points, mean post_rl >= mean post_sft + 10
points, and the whole bench within 90 minutes. The held-out set is whatever the config names;
nothing here tunes it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POINTS = ("pre_sft", "post_sft", "post_rl")
SFT_GAIN, RL_GAIN, BUDGET_S = 0.20, 0.10, 90 * 60


def _cfg(path: str, seed: int, out: Path, quick: bool):
    from harnessrl.trainers.loop import load_config

    cfg = load_config(path)
    update = {"out_dir": str(out / f"seed{seed}"), "progress": False, "tensorboard": False,
              "trainer": cfg.trainer.model_copy(update={"seed": seed})}
    if quick:  # the pipeline end to end, not a measurement
        update |= {"steps": 1, "sft": cfg.sft.model_copy(update={"steps": 2}),
                   "eval": cfg.eval.model_copy(update={"max_tasks": 2, "episodes_per_task": 1})}
    return cfg.model_copy(update=update)


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(s: dict | None) -> str:
    if not s or not s.get("n"):
        return "-"
    lo, hi = s["ci95"]
    return f"{s['successes']}/{s['n']} = {s['success_rate']:.2f} [{lo:.2f}, {hi:.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "learn-cpu.toml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default="runs/bench-learning")
    p.add_argument("--quick", action="store_true", help="1 RL step, 2 SFT steps, 2 held-out tasks: a trial only")
    a = p.parse_args(argv)
    if len(a.seeds) < 2 and not a.quick:
        print("learning_curve: --seeds needs at least 2 seeds", file=sys.stderr)
        return 2
    from harnessrl.trainers.loop import train

    out = Path(a.out)
    t0 = time.monotonic()
    runs = []
    for seed in a.seeds:
        cfg = _cfg(a.config, seed, out, a.quick)
        print(f"== seed {seed}: {cfg.out_dir}", flush=True)
        s0 = time.monotonic()
        asyncio.run(train(cfg))
        report = json.loads((Path(cfg.out_dir) / "report.json").read_text())
        runs.append(run_of(seed, time.monotonic() - s0, report))
    wall = time.monotonic() - t0
    print(json.dumps(verdict(runs, wall, a.config, a.seeds, a.quick)))
    return 0


def run_of(seed: int, wall_s: float, report: dict) -> dict:
    """One seed's row from its run's report.json."""
    return {"seed": seed, "wall_s": round(wall_s, 1), "eval": report.get("eval", {}),
            "rl_reward_mean": report.get("reward_mean"), "prepare": report.get("prepare")}


def verdict(runs: list[dict], wall: float, config: str, seeds: list[int], quick: bool) -> dict:
    """Print the table, the means and the failure counts; return the JSON line's fields."""
    print("\nheld-out success (successes/n = rate [95% Wilson CI]):")
    print(f"{'seed':>6}  " + "  ".join(f"{p:<26}" for p in POINTS) + "  wall")
    for r in runs:
        print(f"{r['seed']:>6}  " + "  ".join(f"{_fmt(r['eval'].get(p)):<26}" for p in POINTS) + f"  {r['wall_s']:.0f}s")
    mean = {p: _mean([(r["eval"].get(p) or {}).get("success_rate") for r in runs]) for p in POINTS}
    print(f"{'mean':>6}  " + "  ".join(f"{'-' if mean[p] is None else format(mean[p], '.3f'):<26}" for p in POINTS)
          + f"  {wall:.0f}s total")
    why = {p: dict(sum((Counter((r["eval"].get(p) or {}).get("outcomes", {})) for r in runs), Counter()))
           for p in POINTS}
    for p in POINTS:
        print(f"  {p}: " + (", ".join(f"{k} {v}" for k, v in why[p].items() if v) or "no episodes"))
    ok = all(mean[p] is not None for p in POINTS)
    sft_gain = mean["post_sft"] - mean["pre_sft"] if ok else None
    rl_gain = mean["post_rl"] - mean["post_sft"] if ok else None
    met = bool(ok and sft_gain >= SFT_GAIN - 1e-9 and rl_gain >= RL_GAIN - 1e-9 and wall <= BUDGET_S and not quick)
    failures = Counter({k: v for k, v in why["post_rl"].items() if k != "success"})
    limited = failures.most_common(1)[0][0] if failures else None
    if not met:
        print("target NOT met: " + "; ".join(x for x in (
            None if ok else "a point has no scored episode",
            None if not ok or sft_gain >= SFT_GAIN - 1e-9 else f"SFT gained {100 * sft_gain:+.1f} points (< +20)",
            None if not ok or rl_gain >= RL_GAIN - 1e-9 else f"RL gained {100 * rl_gain:+.1f} points (< +10)",
            None if wall <= BUDGET_S else f"wall {wall:.0f}s > {BUDGET_S}s",
            "--quick is a trial, not a measurement" if quick else None) if x)
              + (f"; post_rl episodes failed mostly by {limited} ({failures[limited]} of {sum(failures.values())})"
                 if limited else ""))
    return {"bench": "learning_curve", "config": config, "seeds": seeds, "quick": quick,
        "per_seed": [{"seed": r["seed"], "wall_s": r["wall_s"],
                      **{p: (r["eval"].get(p) or {}).get("success_rate") for p in POINTS},
                      **{f"{p}_n": (r["eval"].get(p) or {}).get("n") for p in POINTS}} for r in runs],
        "mean": mean, "sft_gain": sft_gain, "rl_gain": rl_gain, "outcomes": why,
        "limited_by": limited, "wall_s": round(wall, 1), "budget_s": BUDGET_S,
        "target_met": met}


if __name__ == "__main__":
    sys.exit(main())
