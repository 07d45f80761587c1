"""The "sampled" distribution (`trainers.engine.sampling`) on hand-computed numbers.

Logits are logs of small integers, so every probability below is a fraction derived in the
comments: softmax(log w) = w / sum(w).
"""
from __future__ import annotations

import math

import pytest
import torch

from harnessrl.trainers.engine import cpu_matvec
from harnessrl.trainers.engine.sampling import RowParams, processed_logprobs, sample

L = math.log
NEG = -math.inf


def lp(weights, temperature=1.0, top_p=1.0, top_k=-1, always_keep=None):
    logits = torch.tensor([[L(w) for w in weights]], dtype=torch.float64)
    keep = None if always_keep is None else torch.tensor([always_keep])
    return processed_logprobs(logits, torch.tensor([temperature], dtype=torch.float64),
                              torch.tensor([top_p], dtype=torch.float64), torch.tensor([top_k]), keep)[0].tolist()


def test_no_filter_is_tempered_log_softmax():
    # w = 4, 2, 1, 1 -> p = 1/2, 1/4, 1/8, 1/8
    assert lp([4, 2, 1, 1]) == pytest.approx([L(1 / 2), L(1 / 4), L(1 / 8), L(1 / 8)], abs=1e-12)
    # T = 0.5 squares the weights: 16, 4, 1, 1 -> /22
    assert lp([4, 2, 1, 1], temperature=0.5) == pytest.approx([L(16 / 22), L(4 / 22), L(1 / 22), L(1 / 22)], abs=1e-12)


def test_top_k_renormalizes_over_the_kept_tokens():
    # k = 2 keeps weights 4, 2 -> 2/3, 1/3
    assert lp([4, 2, 1, 1], top_k=2) == pytest.approx([L(2 / 3), L(1 / 3), NEG, NEG])
    # k = 3: the 3rd largest logit is log 1, shared by tokens 2 and 3 -> both kept, nothing dropped
    assert lp([4, 2, 1, 1], top_k=3) == pytest.approx([L(1 / 2), L(1 / 4), L(1 / 8), L(1 / 8)])
    # k = 1 is a point mass on the top token
    assert lp([4, 2, 1, 1], top_k=1) == pytest.approx([0.0, NEG, NEG, NEG])


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # p = 1/2, 1/4, 1/8, 1/8; mass ranked above each token: 0, 1/2, 3/4, 7/8
    # top_p 0.6: kept while that mass < 0.6 -> tokens 0, 1 -> 2/3, 1/3
    assert lp([4, 2, 1, 1], top_p=0.6) == pytest.approx([L(2 / 3), L(1 / 3), NEG, NEG])
    # top_p 0.5: token 1 has 1/2 above it, not < 0.5 -> only token 0
    assert lp([4, 2, 1, 1], top_p=0.5) == pytest.approx([0.0, NEG, NEG, NEG])
    # top_p 0.8: tokens 0, 1, 2 by rank (3/4 < 0.8); token 3 ties token 2's probability and
    # is kept with it (the filter compares values, not sort positions) -> the full distribution
    assert lp([4, 2, 1, 1], top_p=0.8) == pytest.approx([L(1 / 2), L(1 / 4), L(1 / 8), L(1 / 8)])


def test_temperature_then_top_p():
    # T = 0.5: 16/22, 4/22, 1/22, 1/22; mass above: 0, 16/22 = .727, 20/22 = .909, ...
    # top_p 0.9 keeps tokens 0, 1 -> 16/20, 4/20
    assert lp([4, 2, 1, 1], temperature=0.5, top_p=0.9) == pytest.approx([L(0.8), L(0.2), NEG, NEG])


def test_top_k_then_top_p_on_the_renormalized_rest():
    # w = 5, 3, 1, 1; k = 2 -> 5/8, 3/8. top_p 0.6: 5/8 above token 1 -> only token 0.
    assert lp([5, 3, 1, 1], top_k=2, top_p=0.6) == pytest.approx([0.0, NEG, NEG, NEG])
    # top_p 0.7: 5/8 = .625 < .7 -> both stay, 5/8 and 3/8 (top-p of the *renormalized* top-k)
    assert lp([5, 3, 1, 1], top_k=2, top_p=0.7) == pytest.approx([L(5 / 8), L(3 / 8), NEG, NEG])


def test_greedy_is_a_point_mass():
    assert lp([4, 2, 1, 1], temperature=0.0) == pytest.approx([0.0, NEG, NEG, NEG])


def test_always_keep_adds_the_scored_token_to_the_kept_set():
    # top_p 0.5 keeps token 0 alone; forcing token 2 in: weights 4, 1 -> 4/5, 1/5
    assert lp([4, 2, 1, 1], top_p=0.5, always_keep=2) == pytest.approx([L(0.8), NEG, L(0.2), NEG])


def test_gradient_flows_through_the_kept_normalizer_only():
    # top_k 2 over 4, 2, 1, 1: log p0 = z0 - log(e^z0 + e^z1), so d/dz = (1 - 2/3, -1/3, 0, 0)
    z = torch.tensor([[L(4), L(2), L(1), L(1)]], dtype=torch.float64, requires_grad=True)
    out = processed_logprobs(z, torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                             torch.tensor([2]))
    out[0, 0].backward()
    assert z.grad[0].tolist() == pytest.approx([1 / 3, -1 / 3, 0.0, 0.0], abs=1e-12)
    # at temperature T the derivative is divided by T: T = 0.5 keeps weights 16, 4 -> 4/5, 1/5
    z.grad = None
    out = processed_logprobs(z, torch.tensor([0.5], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                             torch.tensor([2]))
    out[0, 0].backward()
    assert z.grad[0].tolist() == pytest.approx([(1 - 0.8) / 0.5, -0.2 / 0.5, 0.0, 0.0], abs=1e-12)


def test_rows_keep_their_own_parameters():
    logits = torch.tensor([[L(4), L(2), L(1), L(1)]] * 3, dtype=torch.float64)
    out = processed_logprobs(logits, torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64),
                             torch.tensor([1.0, 1.0, 0.6], dtype=torch.float64), torch.tensor([2, -1, -1]))
    assert out[0].tolist() == pytest.approx([L(2 / 3), L(1 / 3), NEG, NEG])
    assert out[1].tolist() == pytest.approx([L(16 / 22), L(4 / 22), L(1 / 22), L(1 / 22)])
    assert out[2].tolist() == pytest.approx([L(2 / 3), L(1 / 3), NEG, NEG])


def test_sample_reports_the_space_it_is_asked_for():
    logits = torch.tensor([[L(4), L(2), L(1), L(1)]] * 64)
    gen = torch.Generator().manual_seed(0)
    rows = [RowParams(1.0, top_k=2) for _ in range(64)]
    ids, lps, tops = sample(logits, rows, gen, top_logprobs_num=3)
    assert set(ids) == {0, 1}  # 64 draws from 2/3, 1/3: both appear, nothing outside the top 2
    assert lps == pytest.approx([L(2 / 3) if i == 0 else L(1 / 3) for i in ids], abs=1e-6)
    assert [t for _, t in tops[0]] == [0, 1]  # the dropped tokens have no logprob to report
    ids, lps, _ = sample(logits, rows, torch.Generator().manual_seed(0), space="tempered")
    assert set(ids) == {0, 1}
    assert lps == pytest.approx([L(1 / 2) if i == 0 else L(1 / 4) for i in ids], abs=1e-6)
    # greedy: the argmax, reported (both spaces) with SGLang's temperature-1 score, log 1/2
    g = [RowParams(0.0)]
    for space in ("sampled", "tempered"):
        ids, lps, _ = sample(logits[:1], g, gen, space=space)
        assert ids == [0] and lps == pytest.approx([L(1 / 2)], abs=1e-6)
    # top_k 1 at temperature 1 is a point mass in "sampled": logprob 0
    assert sample(logits[:1], [RowParams(1.0, top_k=1)], gen)[:2] == ([0], [0.0])


def _draws(weights, n, seed=0, **params):
    logits = torch.tensor([[L(w) for w in weights]] * n, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    ids, _, _ = sample(logits, [RowParams(params.pop("temperature", 1.0), generator=gen, **params)] * n, gen)
    return ids


@pytest.fixture(params=["compiled", "torch"])
def draw_path(request, monkeypatch):
    """`sample` draws with the compiled inversion, or (no compiler, HARNESSRL_CPU_MATVEC=0) with
    the torch one."""
    if request.param == "compiled":
        assert cpu_matvec.load() is not None, "the image has a C compiler: the kernel must build"
    else:
        monkeypatch.setattr(cpu_matvec, "load", lambda defines=(): None)
    return request.param


@pytest.mark.usefixtures("draw_path")
def test_draws_follow_the_sampled_distribution():
    # w = 4, 2, 1, 1 -> 1/2, 1/4, 1/8, 1/8; 40,000 draws: each count within 4.5 sigma of n * p
    n = 40_000
    ids = _draws([4, 2, 1, 1], n)
    for token, p in enumerate([1 / 2, 1 / 4, 1 / 8, 1 / 8]):
        assert abs(ids.count(token) - n * p) < 4.5 * math.sqrt(n * p * (1 - p)), (token, ids.count(token))
    # top-k = 2 keeps 4, 2 -> 2/3, 1/3; the dropped tokens (probability 0) are never drawn
    ids = _draws([4, 2, 1, 1], n, seed=1, top_k=2)
    assert set(ids) == {0, 1}
    assert abs(ids.count(0) - n * 2 / 3) < 4.5 * math.sqrt(n * 2 / 9)
    # a token of probability 0 at either end of the vocabulary, and between kept ones
    ids = _draws([1, 8, 1, 8, 1], 5_000, seed=2, top_k=2)
    assert set(ids) == {1, 3}


@pytest.mark.usefixtures("draw_path")
def test_draws_are_reproducible_one_uniform_per_row():
    a = _draws([3, 1, 2, 5, 1, 1], 300, seed=7)
    assert a == _draws([3, 1, 2, 5, 1, 1], 300, seed=7)
    assert a != _draws([3, 1, 2, 5, 1, 1], 300, seed=8)
    # the generator advances by one float64 uniform per drawn row, greedy rows draw nothing
    gen = torch.Generator().manual_seed(3)
    logits = torch.tensor([[L(w) for w in [3, 1, 2]]] * 3)
    sample(logits, [RowParams(1.0, generator=gen), RowParams(0.0, generator=gen), RowParams(0.7, generator=gen)], gen)
    ref = torch.Generator().manual_seed(3)
    torch.rand(2, generator=ref, dtype=torch.float64)
    assert torch.equal(gen.get_state(), ref.get_state())


@pytest.mark.usefixtures("draw_path")
def test_a_distribution_that_is_not_one_raises():
    logits = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(RuntimeError, match="invalid probability distribution"):
        sample(logits, [RowParams(1.0)], torch.Generator().manual_seed(0))


def _reference_draw(probs: torch.Tensor, u: float) -> int:
    """The one-pass inversion the two-level `draw` replaces: the first token whose float64
    running sum over the whole vocabulary exceeds u * total."""
    cdf = torch.cumsum(probs, 0, dtype=torch.float64)
    return int(torch.searchsorted(cdf, torch.tensor(u, dtype=torch.float64) * cdf[-1], right=True))


def test_two_level_draw_picks_the_tokens_of_the_one_pass_inversion():
    """Blocks of 1024 (the vocabulary not a multiple: its zero-padded tail), whole blocks of
    zero mass and zero tokens inside blocks: for the same uniforms the two-level inversion
    picks the one-pass inversion's token, and never one of probability 0."""
    from harnessrl.trainers.engine.sampling import BLOCK, block_sums, draw

    v = 3 * BLOCK + 37
    gen = torch.Generator().manual_seed(11)
    probs = torch.rand(v, generator=gen) ** 4
    probs[BLOCK:2 * BLOCK] = 0.0  # a whole block without mass
    probs[::7] = 0.0
    probs[-5:] = 0.3  # mass in the padded tail block
    blocks, cdf = block_sums(probs[None])
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    picked = []
    for _ in range(3000):
        token = draw(blocks[0], cdf[0], a)
        u = float(torch.rand((), generator=b, dtype=torch.float64))
        assert token == _reference_draw(probs, u), u
        picked.append(token)
    assert all(probs[t] > 0 for t in picked)
    assert not any(BLOCK <= t < 2 * BLOCK for t in picked)
    assert any(t >= 3 * BLOCK for t in picked) and any(t < BLOCK for t in picked)
    assert torch.equal(a.get_state(), b.get_state())  # one uniform per draw


def test_compiled_draw_picks_the_tokens_of_the_one_pass_inversion():
    """`draw_rows` (C) on rows whose weights are exactly 1 or 0 (log-probabilities 0 or -inf, so
    its exp and the float64 sums are exact): blocks of 1024 with the vocabulary not a multiple
    (the short tail block), a whole block without mass, dropped tokens inside blocks, rows of
    different supports in one call. For the same uniforms it picks the one-pass inversion's
    token every time, never a dropped one, and advances the generator by one uniform a row."""
    from harnessrl.trainers.engine.sampling import BLOCK, draw_rows

    lib = cpu_matvec.load()
    assert lib is not None, "the image has a C compiler: the kernel must build"
    v = 3 * BLOCK + 37
    keep = torch.ones(4, v, dtype=torch.bool)
    keep[0, BLOCK:2 * BLOCK] = False  # a whole block without mass
    keep[0, ::7] = False
    keep[1, : 3 * BLOCK] = False  # mass only in the short tail block
    keep[2, 1::2] = False
    keep[3, 5:] = False  # five tokens at the front
    table = torch.zeros(4, v).masked_fill(~keep, -torch.inf)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    picked = [[] for _ in range(4)]
    for _ in range(500):
        ids = draw_rows(lib, table, [a] * 4)
        for r, token in enumerate(ids):
            u = float(torch.rand((), generator=b, dtype=torch.float64))
            assert token == _reference_draw(keep[r].double(), u), (r, u)
            picked[r].append(token)
    assert torch.equal(a.get_state(), b.get_state())  # one uniform per row
    assert all(bool(keep[r, t]) for r in range(4) for t in picked[r])
    assert not any(BLOCK <= t < 2 * BLOCK for t in picked[0]) and any(t >= 2 * BLOCK for t in picked[0])
    assert min(picked[1]) >= 3 * BLOCK and set(picked[3]) == set(range(5))
    with pytest.raises(RuntimeError, match="invalid probability distribution"):
        draw_rows(lib, torch.full((1, 10), -torch.inf), [a])


def test_reported_logprobs_are_the_processed_table_bit_for_bit():
    """Over a real vocabulary size, the chosen tokens' logprobs are `processed_logprobs`' own
    float32 numbers (what a trainer recomputes from the same logits), with and without a
    top-n list, and a top-n list's entry for the chosen token carries the same number."""
    v, n = 49152, 6
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(n, v, generator=gen) * 4
    rows = [RowParams(t) for t in (1.0, 0.7, 1.3, 1.0, 0.5, 2.0)]
    ids, lps, tops = sample(logits, rows, torch.Generator().manual_seed(0))
    temps = torch.tensor([r.temperature for r in rows])
    table = processed_logprobs(logits, temps, torch.ones(n), torch.full((n,), -1))
    assert tops == []
    assert lps == [float(table[i, t]) for i, t in enumerate(ids)]
    ids2, lps2, tops2 = sample(logits, rows, torch.Generator().manual_seed(0), top_logprobs_num=50)
    assert ids2 == ids and lps2 == lps
    for t, lp, top in zip(ids, lps, tops2):
        assert dict((ix, x) for x, ix in top).get(t, lp) == lp


def test_temperature_one_rows_skip_the_division_with_the_same_bits_and_gradient():
    """Rows all at temperature 1 skip `logits / 1` (exact in IEEE): the table equals the divided
    one bit for bit, a mixed batch still divides, and the gradient reaches the logits."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 49152, generator=gen) * 5).requires_grad_()
    ones = torch.ones(3)
    table = processed_logprobs(logits, ones, ones, torch.full((3,), -1))
    assert torch.equal(table, torch.log_softmax(logits / ones[:, None], dim=-1))
    table[:, 7].sum().backward()
    assert logits.grad is not None and bool((logits.grad[:, 7] > 0).all())
    mixed = torch.tensor([1.0, 0.5, 1.0])
    assert torch.equal(processed_logprobs(logits.detach(), mixed, ones, torch.full((3,), -1)),
                       torch.log_softmax(logits.detach() / mixed[:, None], dim=-1))
