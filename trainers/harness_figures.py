"""Per-harness figures of a run that mixes harnesses (`rollout.harnesses`).

Contract: `step_figures(batch, samples, names)` is the step line's "harnesses" section, one
entry per harness of the run (a harness no episode of the step ran through has zeros and
Nones): `episodes`, `groups`, `reward_mean` and `success_rate` over its scored episodes (the
step's own rule, `dynamic_sampling.outcome`: canaries and infrastructure failures out),
`masked_infra` (the one masking rule, `samples.masked`), `completion_tokens` (every sampled
token of its calls), `harness_errors` (episodes whose harness crashed or exited non-zero:
the agent's failures, scored) and `failures` (`masked_infra` + `harness_errors`).
`HarnessTally` adds those up over a run for report.json (`totals()`: the same fields, the
means over every scored episode of the run). A trajectory's harness is `Trajectory.harness`
(the adapter's name; the scheduler's own records carry their group's).
"""
from __future__ import annotations

from typing import Any, Iterable

from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.dynamic_sampling import outcome
from harnessrl.trainers.samples import SampleConfig, masked


def _harness_errors(batch: list[Trajectory]) -> int:
    return sum(1 for t in batch if t.status != "infra_error" and (
        t.termination == "harness_crashed" or t.metadata.get("harness_exit_code") not in (0, None)))


def _figures(batch: list[Trajectory], samples: SampleConfig) -> dict[str, Any]:
    o = outcome(batch, samples)
    errors = _harness_errors(batch)
    return {"episodes": len(batch), "groups": len({t.metadata.get("group_id") for t in batch}),
            "reward_mean": o["reward_mean"], "success_rate": o["success_rate"], "masked_infra": o["masked_infra"],
            "completion_tokens": sum(len(c.completion_ids) for t in batch for c in t.calls),
            "harness_errors": errors, "failures": o["masked_infra"] + errors}


def step_figures(batch: list[Trajectory], samples: SampleConfig, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each harness's figures over the episodes of `batch` it ran (module doc)."""
    return {h: _figures([t for t in batch if t.harness == h], samples) for h in names}


def line(figures: dict[str, dict[str, Any]]) -> str:
    """The step line's per-harness part: `name reward/success (episodes)` for each."""
    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    return "  ".join(f"{h} {f(x['reward_mean'], '.3f')}/{f(x['success_rate'], '.2f')} ({x['episodes']} ep"
                     + (f", {x['failures']} failed" if x["failures"] else "") + ")" for h, x in figures.items())


class HarnessTally:
    """The run's per-harness totals (module doc); keeps numbers only."""

    def __init__(self, names: Iterable[str], samples: SampleConfig | None = None):
        self.samples = samples or SampleConfig()
        self.rows: dict[str, dict[str, Any]] = {h: {"episodes": 0, "groups": 0, "scored": 0, "reward_sum": 0.0,
                                                    "successes": 0, "masked_infra": 0, "completion_tokens": 0,
                                                    "harness_errors": 0} for h in names}

    def add(self, batch: list[Trajectory]) -> None:
        for h, row in self.rows.items():
            mine = [t for t in batch if t.harness == h]
            if not mine:
                continue
            scored = [float(t.reward) for t in mine if not t.metadata.get("canary") and t.reward is not None
                      and t.status != "infra_error"]
            row["episodes"] += len(mine)
            row["groups"] += len({t.metadata.get("group_id") for t in mine})
            row["scored"] += len(scored)
            row["reward_sum"] += sum(scored)
            row["successes"] += sum(r >= self.samples.success_threshold for r in scored)
            row["masked_infra"] += sum(1 for t in mine if not t.metadata.get("canary") and masked(t, self.samples))
            row["completion_tokens"] += sum(len(c.completion_ids) for t in mine for c in t.calls)
            row["harness_errors"] += _harness_errors(mine)

    def totals(self) -> dict[str, dict[str, Any]]:
        out = {}
        for h, r in self.rows.items():
            n = r["scored"]
            out[h] = {"episodes": r["episodes"], "groups": r["groups"], "scored": n,
                      "reward_mean": r["reward_sum"] / n if n else None,
                      "success_rate": r["successes"] / n if n else None, "masked_infra": r["masked_infra"],
                      "completion_tokens": r["completion_tokens"], "harness_errors": r["harness_errors"],
                      "failures": r["masked_infra"] + r["harness_errors"]}
        return out
