"""Losses on hand-computed tensors: every expected number is derived in the comments."""
from __future__ import annotations

import math

import pytest
import torch

from harnessrl.trainers.losses import aggregate, decoupled_ppo_loss, kl_k3, ppo_clip_loss

L = math.log


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_ppo_clip_values_and_gradients():
    # logp_old = log 0.5 everywhere; logp = log(0.5 r) so the ratios are r = 1.5, 0.5, 1.1, 0.7.
    ratios = (1.5, 0.5, 1.1, 0.7)
    logp = t(*(L(0.5 * r) for r in ratios)).requires_grad_()
    old = t(*([L(0.5)] * 4))
    adv = t(1.0, -1.0, 2.0, 2.0)
    out = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    # tok0: r=1.5, A=+1: min(1.5, clip(1.5)=1.2) = 1.2 -> loss -1.2, clip active
    # tok1: r=0.5, A=-1: min(-0.5, 0.8*-1=-0.8) = -0.8 -> loss +0.8, clip active
    # tok2: r=1.1, A=+2: min(2.2, 2.2) = 2.2 -> loss -2.2, inside the trust region
    # tok3: r=0.7, A=+2: min(1.4, 0.8*2=1.6) = 1.4 -> loss -1.4, unclipped branch chosen
    assert out.per_token.tolist() == pytest.approx([-1.2, 0.8, -2.2, -1.4], abs=1e-12)
    assert out.clipped.tolist() == [True, True, False, False]
    assert not out.behav_filtered.any()
    out.per_token.sum().backward()
    # d(-r A)/d logp = -r A on the unclipped branch, 0 on the clipped one:
    # tok2: -1.1*2 = -2.2, tok3: -0.7*2 = -1.4
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -2.2, -1.4], abs=1e-12)


def test_ppo_clip_asymmetric_clip_higher():
    # r = 1.5, A = +1 with clip_high 0.28: clipped ratio 1.28 -> loss -1.28.
    # r = 0.5, A = -1 with clip_low 0.2: clipped ratio 0.8 -> loss +0.8 (unchanged).
    out = ppo_clip_loss(t(L(0.75), L(0.25)), t(L(0.5), L(0.5)), t(1.0, -1.0), clip_low=0.2, clip_high=0.28)
    assert out.per_token.tolist() == pytest.approx([-1.28, 0.8], abs=1e-12)


def test_grpo_on_policy_gradient_is_minus_advantage_over_tokens():
    # One on-policy update: logp_old = logp.detach() -> r = 1, per-token loss = -A.
    # Token-level mean over the 3 masked tokens of -A: (-(2) - (-1) - 0.5)/3 = -1.5/3 = -0.5,
    # and d/dlogp_t = -A_t / 3 on masked tokens, 0 on the unmasked one.
    logp = t(L(0.3), L(0.6), L(0.9), L(0.1)).requires_grad_()
    adv = t(2.0, -1.0, 0.5, 7.0)
    mask = t(1.0, 1.0, 1.0, 0.0)
    out = ppo_clip_loss(logp, logp.detach(), adv)
    loss = aggregate(out.per_token.unsqueeze(0), mask.unsqueeze(0), mode="token")
    assert loss.item() == pytest.approx(-0.5, abs=1e-12)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-2 / 3, 1 / 3, -0.5 / 3, 0.0], abs=1e-12)


@pytest.mark.parametrize("mode, tok1_loss", [("cap", 4.0), ("mask", 0.0)])
def test_decoupled_ppo_eq5(mode, tok1_loss):
    # tok0: behav 0.2, prox 0.4 -> w = 2;  current 0.44 -> u = 1.1;  A = +1
    #       loss = -2 * min(1.1, 1.1) = -2.2; d/dlogp = -w u A = -2.2
    # tok1: behav 0.1, prox 0.6 -> w = 6 > cap 5; current 0.3 -> u = 0.5; A = -1
    #       min(-0.5, 0.8*-1 = -0.8) = -0.8 -> surrogate +0.8, clip active, gradient 0
    #       cap: w = 5 -> loss 4.0; mask: w = 0 -> loss 0.0
    # tok2: behav 0.5, prox 0.25 -> w = 0.5; current 0.25 -> u = 1; A = +3
    #       loss = -0.5 * 3 = -1.5; d/dlogp = -0.5 * 1 * 3 = -1.5
    behav = t(L(0.2), L(0.1), L(0.5))
    prox = t(L(0.4), L(0.6), L(0.25))
    logp = t(L(0.44), L(0.3), L(0.25)).requires_grad_()
    adv = t(1.0, -1.0, 3.0)
    out = decoupled_ppo_loss(logp, prox, behav, adv, clip_low=0.2, clip_high=0.2, behav_cap=5.0, behav_mode=mode)
    assert out.per_token.tolist() == pytest.approx([-2.2, tok1_loss, -1.5], abs=1e-12)
    assert out.clipped.tolist() == [False, True, False]
    assert out.behav_filtered.tolist() == [False, True, False]
    out.per_token.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-2.2, 0.0, -1.5], abs=1e-12)


def test_decoupled_ppo_without_cap_and_trust_region_around_proximal():
    # behav 0.1, prox 0.6 -> w = 6 kept (no cap); current 0.9 -> u = 1.5; A = +1
    # min(1.5, 1.2) = 1.2 -> loss = -6 * 1.2 = -7.2 (clipped against prox, not behav:
    # r vs behaviour would be 9, far outside, yet the trust region is 0.6 * [0.8, 1.2]).
    out = decoupled_ppo_loss(t(L(0.9)), t(L(0.6)), t(L(0.1)), t(1.0), behav_cap=None)
    assert out.per_token.tolist() == pytest.approx([-7.2], abs=1e-12)
    assert out.clipped.tolist() == [True] and out.behav_filtered.tolist() == [False]


def test_kl_k3_values_and_gradient():
    # tok0: logp = log .5, ref = log .25: δ = log .5 = -0.693147; k3 = .5 + .693147 - 1 = 0.193147
    # tok1: logp = log .2, ref = log .4:  δ = log 2 = 0.693147;  k3 = 2 - .693147 - 1 = 0.306853
    # tok2: equal -> 0.  d k3/d logp = 1 - exp(δ): 0.5, -1.0, 0.0
    logp = t(L(0.5), L(0.2), L(0.7)).requires_grad_()
    ref = t(L(0.25), L(0.4), L(0.7))
    k3 = kl_k3(logp, ref)
    assert k3.tolist() == pytest.approx([0.5 + L(2) - 1, 2 - L(2) - 1, 0.0], abs=1e-12)
    assert k3.tolist() == pytest.approx([0.193147, 0.306853, 0.0], abs=1e-6)
    k3.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.5, -1.0, 0.0], abs=1e-12)


def test_aggregate_token_vs_sequence():
    v = t(1.0, 2.0, 3.0, 0.0, 4.0, 9.0, 9.0, 9.0).reshape(2, 4)
    m = t(1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0).reshape(2, 4)
    # token: (1 + 2 + 3 + 4) / 4 masked tokens = 2.5 (the 9s are masked out)
    assert aggregate(v, m, mode="token").item() == pytest.approx(2.5)
    # token with the whole batch's count 10 as denominator: 10 / 10 = 1.0
    assert aggregate(v, m, mode="token", denominator=10.0).item() == pytest.approx(1.0)
    # sequence, equal weights: row means 2 and 4 -> (2 + 4) / 2 = 3
    assert aggregate(v, m, mode="sequence").item() == pytest.approx(3.0)
    # sequence, weights .5 and 1: (.5*2 + 1*4) / 1.5 = 5 / 1.5 = 3.3333
    assert aggregate(v, m, mode="sequence", seq_weight=t(0.5, 1.0)).item() == pytest.approx(10 / 3)
    # sequence with an explicit denominator 4: 5 / 4 = 1.25
    assert aggregate(v, m, mode="sequence", seq_weight=t(0.5, 1.0), denominator=4.0).item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="normalization mode 'seq'"):
        aggregate(v, m, mode="seq")


def test_split_trajectory_sequence_normalization_equals_unsplit():
    # One trajectory of 4 sampled tokens with per-token losses 1,2,3,6 (mean 3).
    # Split 1+3 tokens with token-count weights 1/4 and 3/4:
    # 1/4 * 1 + 3/4 * (2+3+6)/3 = 0.25 + 2.75 = 3.0, and Σw = 1 -> 3.0, same as unsplit.
    v = t(1.0, 0.0, 0.0, 2.0, 3.0, 6.0).reshape(2, 3)
    m = t(1.0, 0.0, 0.0, 1.0, 1.0, 1.0).reshape(2, 3)
    split = aggregate(v, m, mode="sequence", seq_weight=t(0.25, 0.75))
    unsplit = aggregate(t(1.0, 2.0, 3.0, 6.0).reshape(1, 4), torch.ones(1, 4, dtype=torch.float64), mode="sequence")
    assert split.item() == pytest.approx(3.0) and unsplit.item() == pytest.approx(3.0)


def test_huge_log_ratio_gives_finite_zero_gradient():
    # A token 1000 nats off-policy with A > 0: the ratio is clamped to e^20, the clip is
    # active, the loss is -1.2 and the gradient is exactly 0 (not nan).
    logp = t(0.0).requires_grad_()
    out = ppo_clip_loss(logp, t(-1000.0), t(1.0))
    assert out.per_token.item() == pytest.approx(-1.2)
    out.per_token.sum().backward()
    assert logp.grad.item() == 0.0
