"""The statistics of held-out evaluation: pass@1 with an interval, and paired tests between points.

Contract (pure functions of per-task results; nothing here runs an episode):
- `pass_at_1(by_task)`: per task the share of its scored samples that succeeded (reward >= 1),
  the mean of those shares over tasks (pass@1, each task weighted once whatever its sample
  count), and a 95% percentile bootstrap interval that resamples *tasks* (the samples of one
  task are not independent: they share its difficulty), 2000 resamples from a fixed seed so the
  same results give the same interval.
- `binom_two_sided(k, n)`: the exact two-sided binomial test of k successes in n at p = 1/2:
  min(1, 2 P(X <= min(k, n - k))). `mcnemar_exact(a, b)` is that test on the discordant pairs
  of two per-task pass/fail maps (b01: tasks failing at `a` and passing at `b`; b10: the
  reverse), over the tasks both hold; p = 1 with no discordant pair.
- `sign_flip(diffs)`: the exact paired permutation test of the mean difference: every one of
  the 2^m sign assignments of the m non-zero differences is equally likely under H0 (no
  effect), p = the share whose |sum| reaches the observed |sum|; past `exact_max` non-zero
  differences, `draws` random assignments from a fixed seed (the observed one counted in).
- `compare(a, b)`: point `a` then point `b` (two `trainers.evaluate.summarize` dicts): the paired
  permutation test and the sign test on per-task pass@1, and McNemar on the greedy episodes
  when both points ran them. `paired_points(evals, order)`: that comparison for each pair of
  consecutive points (and each harness's own, `by_harness`), keyed "a->b"; `paired_line` prints one.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Any, Iterable

__all__ = ["pass_at_1", "binom_two_sided", "mcnemar_exact", "sign_flip", "sign_test", "compare", "task_rates", "paired_points",
           "paired_line"]

BOOTSTRAP_DRAWS = 2000


def task_rates(by_task: dict[str, list[float | None]]) -> dict[str, float]:
    """Each task's share of successful scored samples (tasks with no scored sample left out)."""
    out = {}
    for tid, rewards in by_task.items():
        scored = [r for r in rewards if r is not None]
        if scored:
            out[tid] = sum(1 for r in scored if r >= 1.0) / len(scored)
    return out


def pass_at_1(by_task: dict[str, list[float | None]], draws: int = BOOTSTRAP_DRAWS,
              seed: int = 0) -> tuple[float | None, list[float | None]]:
    """(pass@1, [lo, hi]): module doc. (None, [None, None]) with no scored task."""
    rates = list(task_rates(by_task).values())
    if not rates:
        return None, [None, None]
    rng = random.Random(seed)
    n = len(rates)
    means = sorted(sum(rng.choice(rates) for _ in range(n)) / n for _ in range(draws))
    lo, hi = means[int(0.025 * draws)], means[min(draws - 1, int(math.ceil(0.975 * draws)) - 1)]
    return sum(rates) / n, [lo, hi]


def binom_two_sided(k: int, n: int) -> float:
    """Exact two-sided binomial p-value at p = 1/2 (module doc); 1.0 for n = 0."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_exact(a: dict[str, bool], b: dict[str, bool]) -> dict[str, Any]:
    """Exact McNemar between two per-task pass/fail maps over their common tasks."""
    common = sorted(set(a) & set(b))
    b01 = sum(1 for t in common if not a[t] and b[t])
    b10 = sum(1 for t in common if a[t] and not b[t])
    return {"tasks": len(common), "fail_to_pass": b01, "pass_to_fail": b10, "p": binom_two_sided(b01, b01 + b10)}


def sign_flip(diffs: Iterable[float], exact_max: int = 20, draws: int = 20000, seed: int = 0) -> float:
    """Exact (or, past `exact_max` non-zero differences, seeded Monte Carlo) paired permutation p."""
    d = [x for x in diffs if x != 0]
    if not d:
        return 1.0
    observed = abs(sum(d)) - 1e-12 * len(d)  # ties in floating point count as reaching it
    if len(d) <= exact_max:
        hits = sum(1 for signs in itertools.product((1, -1), repeat=len(d))
                   if abs(sum(s * x for s, x in zip(signs, d))) >= observed)
        return hits / 2 ** len(d)
    rng = random.Random(seed)
    hits = sum(1 for _ in range(draws) if abs(sum(x if rng.random() < 0.5 else -x for x in d)) >= observed)
    return (hits + 1) / (draws + 1)


def sign_test(diffs: Iterable[float]) -> float:
    """The exact sign test: how many non-zero differences are positive, against n/2."""
    d = [x for x in diffs if x != 0]
    return binom_two_sided(sum(1 for x in d if x > 0), len(d))


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Point `a` -> point `b` (module doc): per-task pass@1 difference, its paired tests, and
    McNemar on greedy episodes when both points have them."""
    ra, rb = task_rates(a.get("by_task") or {}), task_rates(b.get("by_task") or {})
    common = sorted(set(ra) & set(rb))
    diffs = [rb[t] - ra[t] for t in common]
    out: dict[str, Any] = {
        "tasks": len(common), "pass_at_1_diff": sum(diffs) / len(diffs) if diffs else None,
        "better": sum(1 for x in diffs if x > 0), "worse": sum(1 for x in diffs if x < 0),
        "permutation_p": sign_flip(diffs), "sign_p": sign_test(diffs)}
    ga, gb = (a.get("greedy") or {}).get("by_task"), (b.get("greedy") or {}).get("by_task")
    if ga is not None and gb is not None:
        out["greedy_mcnemar"] = mcnemar_exact({t: bool(v) for t, v in ga.items()}, {t: bool(v) for t, v in gb.items()})
    return out


def paired_points(evals: dict[str, dict[str, Any]], order: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`compare` for each consecutive pair of the points present (in `order`), with each harness's
    own comparison under `by_harness` when both points ran several."""
    names = [p for p in order if p in evals and evals[p].get("n")]
    out = {}
    for a, b in zip(names, names[1:]):
        c = compare(evals[a], evals[b])
        ha, hb = evals[a].get("by_harness") or {}, evals[b].get("by_harness") or {}
        if set(ha) & set(hb):
            c["by_harness"] = {h: compare(ha[h], hb[h]) for h in ha if h in hb}
        out[f"{a}->{b}"] = c
    return out


def paired_line(name: str, c: dict[str, Any]) -> str:
    """`a->b: pass@1 +d (better/worse of tasks), permutation p, sign p[, greedy McNemar]`."""
    g = c.get("greedy_mcnemar")
    greedy = (f"; greedy {g['fail_to_pass']} fail->pass, {g['pass_to_fail']} pass->fail, McNemar p {g['p']:.3g}"
              if g else "")
    if not c["tasks"]:  # e.g. a transfer harness evaluated greedy only
        return f"{name}: no sampled task scored at both points" + greedy
    return (f"{name}: pass@1 {100 * c['pass_at_1_diff']:+.1f} points ({c['better']} tasks better, {c['worse']} worse "
            f"of {c['tasks']}), paired permutation p {c['permutation_p']:.3g}, sign p {c['sign_p']:.3g}" + greedy)
