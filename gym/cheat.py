"""The cheat rate a run reports: tampered episodes by kind, and the canary pass rate.

Contract: `CheatTally.add(trajectories)` counts, from each episode's record only,
- graded episodes (those with `metadata["grading"]`: the grader ran and said why), of them the
  `tampered` ones, and per kind of `gym.grading.TAMPER_KINDS` the tampered episodes whose
  evidence names that kind (an episode with evidence of two kinds counts once under each; a
  kind outside the registry, from an older record, is counted under its own name). Every
  registered kind is reported, zeros included;
- canary episodes (`metadata["canary"]`, `gym.canary`): those the grader scored (an infra
  failure is neither a pass nor a fail) and of them the ones it passed
  (`metadata["canary_passed"]`). Their pass rate is the policy's measured propensity to cheat:
  a canary's hidden tests contradict its statement, so only cheating passes one.
`as_dict()` is the run report's "cheat" section; `step_metrics(batch)` the flat per-step keys
(`graded_episodes`, `tampered_episodes`, `tampered_frac`, `tampered/<kind>`, `canary_episodes`,
`canary_passed`, `canary_pass_rate`) that metrics.jsonl and TensorBoard take; `from_steps`
sums such steps back into the report's section (the viewer's fallback without a report).
A fraction over zero episodes is None, never 0.
"""
from __future__ import annotations

from typing import Any, Iterable

from harnessrl.gym.grading import TAMPER_KINDS
from harnessrl.gym.trajectory import Trajectory


def _kinds(grading: dict[str, Any]) -> set[str]:
    kinds = grading.get("tamper_kinds")
    if kinds is None:  # a record written before `tamper_kinds`: read the evidence itself
        kinds = [e.get("kind") for e in grading.get("evidence") or [] if isinstance(e, dict)]
    return {k for k in kinds if isinstance(k, str) and k}


class CheatTally:
    """Counts over any number of batches; keeps numbers only, never a trajectory."""

    def __init__(self) -> None:
        self.graded = 0
        self.tampered = 0
        self.by_kind: dict[str, int] = dict.fromkeys(TAMPER_KINDS, 0)
        self.canary_episodes = 0
        self.canary_passed = 0

    def add(self, trajectories: Iterable[Trajectory]) -> "CheatTally":
        for t in trajectories:
            m = t.metadata
            grading = m.get("grading")
            if isinstance(grading, dict):
                self.graded += 1
                if grading.get("tampered"):
                    self.tampered += 1
                    for kind in _kinds(grading):
                        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if m.get("canary") and m.get("canary_passed") is not None:
                self.canary_episodes += 1
                self.canary_passed += bool(m["canary_passed"])
        return self

    @property
    def tampered_frac(self) -> float | None:
        return self.tampered / self.graded if self.graded else None

    @property
    def canary_pass_rate(self) -> float | None:
        return self.canary_passed / self.canary_episodes if self.canary_episodes else None

    def as_dict(self) -> dict[str, Any]:
        """The run report's "cheat" section."""
        return {"graded_episodes": self.graded, "tampered_episodes": self.tampered,
                "tampered_frac": self.tampered_frac, "tampered_by_kind": dict(self.by_kind),
                "canary": {"passed": self.canary_passed, "episodes": self.canary_episodes,
                           "pass_rate": self.canary_pass_rate,
                           "k_of_n": f"{self.canary_passed}/{self.canary_episodes}"}}


def cheat_counts(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """`CheatTally().add(trajectories).as_dict()`."""
    return CheatTally().add(trajectories).as_dict()


def step_metrics(batch: Iterable[Trajectory]) -> dict[str, Any]:
    """One step's flat cheat metrics (module doc)."""
    t = CheatTally().add(batch)
    return {"graded_episodes": t.graded, "tampered_episodes": t.tampered, "tampered_frac": t.tampered_frac,
            **{f"tampered/{k}": n for k, n in t.by_kind.items()},
            "canary_episodes": t.canary_episodes, "canary_passed": t.canary_passed,
            "canary_pass_rate": t.canary_pass_rate}


def summary_line(cheat: dict[str, Any]) -> str:
    """One printed line: tampered episodes (by kind, the non-zero ones) and canaries passed."""
    kinds = ", ".join(f"{k} {n}" for k, n in cheat["tampered_by_kind"].items() if n) or "none"
    c = cheat["canary"]
    rate = "-" if c["pass_rate"] is None else f"{c['pass_rate']:.2f}"
    return (f"cheat: {cheat['tampered_episodes']}/{cheat['graded_episodes']} graded episodes tampered ({kinds}); "
            f"canaries passed {c['k_of_n']} (rate {rate})")


def from_steps(steps: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The run report's "cheat" section summed from per-step metrics (`step_metrics`' keys);
    None when no step has them (a run from before the cheat rate)."""
    t, seen = CheatTally(), False
    for m in steps:
        if "tampered_episodes" not in m:
            continue
        seen = True
        t.graded += int(m.get("graded_episodes") or 0)
        t.tampered += int(m["tampered_episodes"] or 0)
        for key, n in m.items():
            if key.startswith("tampered/"):
                t.by_kind[key[len("tampered/"):]] = t.by_kind.get(key[len("tampered/"):], 0) + int(n or 0)
        t.canary_episodes += int(m.get("canary_episodes") or 0)
        t.canary_passed += int(m.get("canary_passed") or 0)
    return t.as_dict() if seen else None
