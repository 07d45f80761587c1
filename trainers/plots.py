"""The run's plots.png: the RL reward curve, the held-out evaluation points, latencies.

Contract: `plot(history, path, evals)` draws what it is given (RL step metrics from
`trainers.loop`, evaluation summaries from `trainers.evaluate`, by point name) into one PNG and
returns its path, or None when there is nothing to draw. Evaluation points are drawn in run
order (pre_sft, post_sft, post_rl) with their Wilson 95% intervals as error bars.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.trainers.evaluate import POINTS


def _nan(v: Any) -> float:
    return float("nan") if v is None else v


def plot(history: list[dict[str, Any]], path: Path, evals: dict[str, dict[str, Any]] | None = None) -> Path | None:
    evals = {k: v for k, v in (evals or {}).items() if v.get("n")}
    if not history and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (["eval"] if evals else []) + (["reward", "latency"] if history else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "eval":
            _eval_panel(ax, evals)
        elif panel == "reward":
            steps = [m["step"] for m in history]
            ax.plot(steps, [_nan(m["reward_mean"]) for m in history], "o-", label="reward mean")
            ax.plot(steps, [_nan(m["success_rate"]) for m in history], "s--", label="success rate")
            ax.set_xlabel("step (SFT steps counted)"), ax.set_title("RL reward (training tasks)"), ax.legend(), ax.set_ylim(-0.05, 1.05)
        else:
            steps = [m["step"] for m in history]
            for key, label in (("env_latency_s", "env p95"), ("model_call_latency_s", "model call p95")):
                ax.plot(steps, [_nan(m["batch_report"][key]["p95"]) for m in history], "o-", label=label)
            ax.set_xlabel("step"), ax.set_ylabel("seconds"), ax.set_title("latency (p95 per batch)"), ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _eval_panel(ax, evals: dict[str, dict[str, Any]]) -> None:
    names = [p for p in POINTS if p in evals]
    rates = [evals[p]["success_rate"] for p in names]
    # clamped: at 0 or n successes the Wilson bound can sit 1e-17 inside the rate (matplotlib refuses < 0)
    lo = [max(0.0, r - evals[p]["ci95"][0]) for p, r in zip(names, rates)]
    hi = [max(0.0, evals[p]["ci95"][1] - r) for p, r in zip(names, rates)]
    ax.errorbar(range(len(names)), rates, yerr=[lo, hi], fmt="o-", capsize=6, label="success (95% Wilson CI)")
    for i, p in enumerate(names):
        ax.annotate(f"{evals[p]['successes']}/{evals[p]['n']}", (i, rates[i]), textcoords="offset points",
                    xytext=(8, 6))
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(-0.05, 1.05), ax.set_title("held-out success"), ax.legend(loc="upper left")
