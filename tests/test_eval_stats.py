"""The held-out statistics (`trainers.eval_stats`) on known values.

The p-values were checked against scipy.stats.binomtest and scipy.stats.permutation_test
(permutation_type="samples", n_resamples=inf) once; scipy is not a dependency, so the numbers
are written here, with the hand computation where it is short.
"""
from __future__ import annotations

import pytest

from harnessrl.trainers import eval_stats as st


@pytest.mark.parametrize("k,n,p", [
    (0, 4, 0.125),              # 2 * 1/16: the "4 tasks flipping" McNemar
    (2, 12, 0.03857421875),     # 2 * (1 + 12 + 66) / 4096
    (3, 10, 0.34375), (7, 10, 0.34375),
    (5, 5, 0.0625),             # 2 / 32
    (9, 20, 0.8238029479980469),
    (0, 0, 1.0),
])
def test_exact_binomial_two_sided(k, n, p):
    assert st.binom_two_sided(k, n) == pytest.approx(p, abs=1e-15)


def test_mcnemar_counts_discordant_tasks_only():
    a = {"t1": False, "t2": False, "t3": False, "t4": False, "t5": True, "t6": True, "only_a": False}
    b = {"t1": True, "t2": True, "t3": True, "t4": True, "t5": True, "t6": True, "only_b": True}
    assert st.mcnemar_exact(a, b) == {"tasks": 6, "fail_to_pass": 4, "pass_to_fail": 0, "p": 0.125}
    assert st.mcnemar_exact(b, a)["p"] == 0.125 and st.mcnemar_exact(a, a)["p"] == 1.0


def test_sign_flip_is_the_exact_paired_permutation_test():
    # five equal positive differences: only all-plus and all-minus reach |sum| = 5 of 32
    assert st.sign_flip([1, 1, 1, 1, 1]) == 2 / 32
    assert st.sign_flip([0.5, 0.25, -0.25, 1.0, 0.75, 0.0, 0.5]) == 0.09375  # scipy: 0.09375
    assert st.sign_flip([0.25] * 6 + [-0.25] * 2) == 0.2890625  # = the sign test here (equal sizes)
    assert st.sign_test([0.25] * 6 + [-0.25] * 2) == 0.2890625
    assert st.sign_flip([0, 0, 0]) == 1.0 and st.sign_test([]) == 1.0
    # past exact_max: a seeded Monte Carlo, reproducible, near the exact value
    d = [0.25] * 18 + [-0.25] * 6
    mc = st.sign_flip(d, exact_max=10)
    assert mc == st.sign_flip(d, exact_max=10) and abs(mc - st.binom_two_sided(6, 24)) < 0.01


def test_pass_at_1_weights_each_task_once_and_bootstraps_tasks():
    by_task = {"a": [1.0, 1.0, 0.0, 0.0], "b": [0.0] * 4, "c": [1.0] * 4, "d": [None, 1.0, 0.0, 0.0], "e": [None]}
    assert st.task_rates(by_task) == {"a": 0.5, "b": 0.0, "c": 1.0, "d": 1 / 3}
    p, (lo, hi) = st.pass_at_1(by_task)
    assert p == pytest.approx((0.5 + 0 + 1 + 1 / 3) / 4)
    assert (lo, hi) == (0.125, pytest.approx(5 / 6)) and (p, [lo, hi]) == st.pass_at_1(by_task)  # same seed, same CI
    assert st.pass_at_1({"x": [1.0] * 3}) == (1.0, [1.0, 1.0]) and st.pass_at_1({}) == (None, [None, None])


def test_compare_pairs_tasks_and_reads_greedy_episodes():
    a = {"by_task": {"t1": [0.0] * 4, "t2": [0.0, 1.0, 0.0, 0.0], "t3": [1.0] * 4, "t4": [0.0] * 4},
         "greedy": {"by_task": {"t1": 0, "t2": 0, "t3": 1, "t4": 0}}}
    b = {"by_task": {"t1": [1.0] * 4, "t2": [1.0, 1.0, 0.0, 0.0], "t3": [1.0] * 4, "t4": [0.0] * 4},
         "greedy": {"by_task": {"t1": 1, "t2": 1, "t3": 1, "t4": 0}}}
    c = st.compare(a, b)
    assert (c["tasks"], c["better"], c["worse"]) == (4, 2, 0)
    assert c["pass_at_1_diff"] == pytest.approx((1.0 + 0.25) / 4)
    assert c["permutation_p"] == 0.5 and c["sign_p"] == 0.5  # 2 of 4 sign assignments reach |1.25|
    assert c["greedy_mcnemar"] == {"tasks": 4, "fail_to_pass": 2, "pass_to_fail": 0, "p": 0.5}
    assert "greedy_mcnemar" not in st.compare({"by_task": a["by_task"]}, b)


# -- SFT order: seeded by the trainer seed, so seeds are independent from the first step ----------
def test_sft_order_depends_on_the_seed_and_covers_each_pass():
    from harnessrl.trainers.sft import sft_batches

    s0, s1 = sft_batches(8, 2, 8, seed=0), sft_batches(8, 2, 8, seed=1)
    assert s0 == sft_batches(8, 2, 8, seed=0) and s0 != s1  # same seed same order, other seed another
    for run in (s0, s1):
        assert all(len(b) == 2 and b == sorted(b) for b in run)
        assert sorted(i for b in run[:4] for i in b) == list(range(8))  # each pass takes every record once
        assert sorted(i for b in run[4:] for i in b) == list(range(8))
    assert sft_batches(5, 2, 3, seed=None) == [[0, 1], [2, 3], [0, 4]]  # file order, cycled, as before
    assert sft_batches(3, 0, 2, seed=7) == [[0, 1, 2], [0, 1, 2]]  # batch 0: the whole file every step
    b = sft_batches(3, 2, 6, seed=3)  # a batch across two passes never repeats a record
    assert all(len(set(x)) == 2 for x in b)


def test_paired_points_and_the_printed_line():
    a = {"n": 8, "by_task": {"t1": [0.0] * 4, "t2": [0.0] * 4}, "greedy": {"by_task": {"t1": 0, "t2": 0}}}
    b = {"n": 8, "by_task": {"t1": [1.0] * 4, "t2": [1.0, 0.0, 0.0, 0.0]}, "greedy": {"by_task": {"t1": 1, "t2": 0}}}
    empty = {"n": 0, "by_task": {}}
    got = st.paired_points({"pre_sft": empty, "post_sft": a, "post_rl": b}, ("pre_sft", "post_sft", "post_rl"))
    assert list(got) == ["post_sft->post_rl"]  # a point with no scored episode pairs with nothing
    assert st.paired_line("post_sft->post_rl", got["post_sft->post_rl"]) == (
        "post_sft->post_rl: pass@1 +62.5 points (2 tasks better, 0 worse of 2), paired permutation p 0.5, "
        "sign p 0.5; greedy 1 fail->pass, 0 pass->fail, McNemar p 1")
    # a transfer harness evaluated greedy only: no sampled task, the greedy test still printed
    greedy_only = st.compare({"by_task": {}, "greedy": a["greedy"]}, {"by_task": {}, "greedy": b["greedy"]})
    assert st.paired_line("x->y", greedy_only) == (
        "x->y: no sampled task scored at both points; greedy 1 fail->pass, 0 pass->fail, McNemar p 1")
    assert st.paired_line("x->y", st.compare({}, {})) == "x->y: no sampled task scored at both points"


def test_the_plot_draws_a_point_whose_wilson_bound_sits_just_above_zero(tmp_path):
    """wilson(0, 6)'s lower bound is 2.8e-17, not 0: the run's plot once died on it (a negative
    error bar) after a whole learning run."""
    from harnessrl.trainers.evaluate import wilson
    from harnessrl.trainers.plots import plot

    assert wilson(0, 6)[0] > 0.0
    evals = {p: {"n": 6, "successes": k, "success_rate": k / 6, "ci95": list(wilson(k, 6))}
             for p, k in (("post_sft", 0), ("post_rl", 6))}
    out = plot([], tmp_path / "plots.png", evals)
    assert out == tmp_path / "plots.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
