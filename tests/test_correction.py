"""Rollout correction on hand-computed tensors: TIS weights and masks in both losses, the
geometric-mean sequence mask, the step's figures. Every expected number is derived in the comments."""
from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from harnessrl.trainers.correction import (CorrectionConfig, Tally, geo_mean_keep, keep_mask, log_ratio,
                                           ratio_summary, token_band_keep)
from harnessrl.trainers.losses import decoupled_ppo_loss, ppo_clip_loss
from harnessrl.trainers.torch_trainer import TorchTrainerConfig

L = math.log


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_tis_truncates_the_behaviour_weight_and_keep_zeroes_it():
    # behav = log 0.1 everywhere; prox = log(0.1 w) so the behaviour weights are w = 3, 1.5, 0.5, 6.
    # logp = prox (one on-policy update): u = 1, the surrogate is -A, its gradient -w·A.
    ws = (3.0, 1.5, 0.5, 6.0)
    prox = t(*(L(0.1 * w) for w in ws))
    logp = prox.clone().requires_grad_()
    behav = t(*([L(0.1)] * 4))
    adv = t(1.0, 1.0, -2.0, 1.0)
    keep = torch.tensor([True, True, True, False])
    out = decoupled_ppo_loss(logp, prox, behav, adv, behav_cap=None, tis_cap=2.0, keep=keep)
    # w after TIS: min(3, 2) = 2, 1.5, 0.5, min(6, 2) = 2 then keep False -> 0
    # per_token = -w·A: -2, -1.5, -0.5·-2 = +1.0, 0
    assert out.per_token.tolist() == pytest.approx([-2.0, -1.5, 1.0, 0.0], abs=1e-12)
    assert out.truncated.tolist() == [True, False, False, True]
    out.per_token.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-2.0, -1.5, 1.0, 0.0], abs=1e-12)
    # uncorrected (no cap, no keep): the weight is the raw ratio, 6 on the last token
    raw = decoupled_ppo_loss(prox, prox, behav, adv, behav_cap=None)
    assert raw.per_token.tolist() == pytest.approx([-3.0, -1.5, 1.0, -6.0], abs=1e-12)
    assert not raw.truncated.any()


def test_tis_applies_after_the_behaviour_cap_filter():
    # behav_cap 5 "mask" first: w = 6 -> 0 (filtered, then not above the TIS cap); w = 3 -> 2 (truncated)
    prox, behav, adv = t(L(0.6), L(0.3)), t(L(0.1), L(0.1)), t(1.0, 1.0)
    out = decoupled_ppo_loss(prox, prox, behav, adv, behav_cap=5.0, behav_mode="mask", tis_cap=2.0)
    assert out.per_token.tolist() == pytest.approx([0.0, -2.0], abs=1e-12)
    assert out.behav_filtered.tolist() == [True, False] and out.truncated.tolist() == [False, True]


def test_ppo_clip_keep_drops_tokens_and_never_truncates():
    # r = 1.1 (A = 2: -2.2) and r = 1 (A = 1: -1), the second dropped by keep
    logp = t(L(0.55), L(0.5)).requires_grad_()
    out = ppo_clip_loss(logp, t(L(0.5), L(0.5)), t(2.0, 1.0), keep=torch.tensor([True, False]))
    assert out.per_token.tolist() == pytest.approx([-2.2, 0.0], abs=1e-12)
    out.per_token.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-2.2, 0.0], abs=1e-12)
    assert not out.truncated.any()


def test_token_band_in_log_space():
    # ratios 0.1, 0.2, 1, 7.9, 9 against [0.125, 8]: out, in, in, in, out
    delta = t(L(0.1), L(0.2), 0.0, L(7.9), L(9.0))
    assert token_band_keep(delta, (0.125, 8.0)).tolist() == [False, True, True, True, False]
    assert token_band_keep(delta, None).all()


def test_geo_mean_sequence_mask():
    delta = t(0.2, -0.1, 5.0, 0.0,
              1.0, 1.0, 0.0, 0.0,
              -3.0, 0.0, 0.0, 0.0).reshape(3, 4)
    mask = t(1, 1, 0, 1,
             1, 1, 0, 0,
             0, 0, 0, 0).reshape(3, 4)
    seq = geo_mean_keep(delta, mask, (0.5, 2.0))
    # row 0: (0.2 - 0.1 + 0.0) / 3 = 0.0333 (the unmasked 5.0 does not count): g = 1.034, kept
    # row 1: (1 + 1) / 2 = 1: g = e = 2.718 > 2, masked
    # row 2: no sampled token: mean 0, g = 1, kept
    assert seq.log_ratio.tolist() == pytest.approx([0.1 / 3, 1.0, 0.0], abs=1e-12)
    assert seq.keep.tolist() == [True, False, True]
    keep, token_keep, _ = keep_mask(delta, mask, CorrectionConfig(token_mask=(0.125, 8.0), seq_mask=(0.5, 2.0)))
    # token band masks row 0's 5.0 (e^5 = 148 > 8) and row 2's -3 (e^-3 = 0.05 < 0.125); row 1 goes whole
    assert token_keep.tolist() == [[True, True, False, True], [True] * 4, [False, True, True, True]]
    assert keep.tolist() == [[True, True, False, True], [False] * 4, [False, True, True, True]]


def test_log_ratio_is_detached_and_clamped():
    prox = t(0.0, -30.0).requires_grad_()
    d = log_ratio(prox, t(-1.0, 0.0))
    assert d.tolist() == [1.0, -20.0] and not d.requires_grad


def test_ratio_summary_quantiles():
    # 0.00, 0.01, ..., 1.00 (101 values): mean 0.5; the q-quantile is exactly q (linear interpolation)
    x = torch.arange(101, dtype=torch.float64) / 100
    s = ratio_summary(x[torch.randperm(101, generator=torch.Generator().manual_seed(0))])
    assert s == pytest.approx({"mean": 0.5, "p50": 0.5, "p95": 0.95, "p99": 0.99, "max": 1.0}, abs=1e-12)
    # the same convention as torch.quantile on an uneven sample
    y = torch.tensor([0.3, 0.01, 2.0, 0.07, 0.5], dtype=torch.float64)
    s = ratio_summary(y)
    assert [s["p50"], s["p95"], s["p99"]] == pytest.approx(torch.quantile(y, t(0.5, 0.95, 0.99)).tolist(), abs=1e-12)
    assert ratio_summary(torch.empty(0)) is None


def test_tally_counts_each_figure():
    cfg = CorrectionConfig(tis_cap=2.0, token_mask=(0.125, 8.0), seq_mask=(0.5, 2.0))
    # row 0: ratios 3, 1, 0.1 (token-masked) ; row 1: ratios e, e -> geo mean e > 2, masked whole
    delta = t(L(3.0), 0.0, L(0.1), 1.0, 1.0, 0.0).reshape(2, 3)
    mask = t(1, 1, 1, 1, 1, 0).reshape(2, 3)
    keep, token_keep, seq = keep_mask(delta, mask, cfg)
    pl = decoupled_ppo_loss(delta, delta, torch.zeros_like(delta), torch.ones_like(delta), behav_cap=None,
                            tis_cap=cfg.tis_cap, keep=keep)
    tally = Tally()
    tally.add(delta, mask, pl.truncated, token_keep, keep, seq)
    m = tally.metrics()
    # 5 trained tokens; truncated: 3 > 2 and e > 2 twice -> 3/5; token-masked: 0.1 -> 1/5;
    # masked: that one + row 1's two -> 3/5; sequences masked 1/2
    assert (m["tis_truncated_frac"], m["token_masked_frac"], m["masked_frac"], m["seq_masked_frac"]) == \
        pytest.approx((3 / 5, 1 / 5, 3 / 5, 1 / 2))
    # |δ| over trained tokens: log 3 = 1.0986, 0, 2.3026, 1, 1 -> mean 5.4012 / 5, median 1, max 2.3026
    assert m["log_ratio_abs_mean"] == pytest.approx((L(3.0) + L(10.0) + 2.0) / 5)
    assert m["log_ratio_abs_p50"] == pytest.approx(1.0) and m["log_ratio_abs_max"] == pytest.approx(L(10.0))
    # geo means: row 0 exp((log 3 + 0 + log 0.1) / 3) = 0.3^(1/3) = 0.6694; row 1 e
    assert m["seq_ratio_min"] == pytest.approx(0.3 ** (1 / 3)) and m["seq_ratio_max"] == pytest.approx(math.e)
    assert Tally().metrics()["log_ratio_abs_mean"] is None


def test_config_defaults_and_refusals():
    cfg = TorchTrainerConfig().correction
    assert (cfg.tis_cap, cfg.token_mask, cfg.seq_mask) == (2.0, None, None)
    with pytest.raises(ValidationError, match=r"seq_mask: \[1.2, 2.0\] must be \[low, high\] with 0 < low <= 1 <= high"):
        CorrectionConfig(seq_mask=(1.2, 2.0))
    with pytest.raises(ValidationError, match="token_mask"):
        CorrectionConfig(token_mask=(0.0, 8.0))
    with pytest.raises(ValidationError, match="tis_cap"):
        CorrectionConfig(tis_cap=0.5)
    # a TOML list is a band
    assert TorchTrainerConfig(correction={"seq_mask": [0.5, 2]}).correction.seq_mask == (0.5, 2.0)
    with pytest.raises(ValidationError, match="tis_threshold"):
        TorchTrainerConfig(correction={"tis_threshold": 2.0})


def test_step_line_shows_the_correction_beside_the_mismatch():
    from harnessrl.trainers.loop import _line

    m = {"step": 3, "version": 3, "updated": True, "reward_mean": 0.5, "success_rate": 0.5, "loss": 0.1,
         "grad_norm": 1.0, "kl": None, "logprob_mismatch_mean": 7.2e-3, "staleness_max": 0, "staleness_mean": 0.0,
         "env_latency_p95_s": 1.0, "step_s": 2.0, "wall_s": 10.0, "log_ratio_abs_p99": 0.0237,
         "log_ratio_abs_max": 3.03, "tis_truncated_frac": 0.25, "masked_frac": 0.25}
    assert "mismatch 7.20e-03  stale 0/0.00  |logr| p99 2.37e-02 max 3.03e+00  trunc 0.250  masked 0.250  env_p95" \
        in _line(m)
    # a trainer without the figures (or a skipped step) prints the line as before
    assert "|logr|" not in _line(m | {"log_ratio_abs_p99": None})
