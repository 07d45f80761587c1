"""Rollout correction: the trainer's policy against the engine's, per token and per sequence.

The engine that sampled a token (its logprob is in the record) and the trainer that
recomputes it differ in numerics (bf16 against float32, other kernels) and, for stale tokens,
in weights. Everything here is a pure function of per-token tensors [rows, positions] of
the log ratio δ = logp_prox - logp_behav (the trainer's logprob before this step's update
minus the engine's recorded one; natural logs) and the loss mask (1 on sampled tokens).
A row is one training sample: one segment of a trajectory, the "sequence" below.

Three corrections, each off when its field is None (`CorrectionConfig`):
- token-level truncated importance sampling (TIS, Yao et al. 2025 "Your efficient RL
  framework secretly brings you off-policy RL training"; verl `rollout_is = "token"` with
  `rollout_is_threshold`): the behaviour weight w = min(exp(δ), C), detached, multiplies the
  policy-gradient loss (`losses.decoupled_ppo_loss(tis_cap=C)`);
- token masking (prime-rl's `token_mask_low/high`, verl `rollout_rs = "token"`): a token whose
  ratio exp(δ) is outside [low, high] drops out of the gradient (`token_band_keep`);
- sequence masking by the geometric mean (verl `rollout_rs = "geometric"`, prime-rl's
  geometric sequence mask): a row whose exp(mean over its masked tokens of δ) is outside
  [low, high] drops out whole (`geo_mean_keep`). The geometric mean does not grow with the
  sequence's length the way the product of ratios does, so one threshold fits every length.

Masked tokens contribute 0 to the loss but stay in its normalization denominator (as
decoupled PPO's `behav_mode = "mask"` does, after AReaL): a batch's loss scale does not jump
when mismatch masks part of it. The KL term to a reference model (`kl_coef`) is not masked: it
compares the trainer with the reference, not with the engine. `ratio_summary` is what a step
reports of the distribution.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from harnessrl.trainers.losses import LOG_RATIO_CLAMP

#: The quantiles of |δ| a step reports (`ratio_summary`).
QUANTILES = (0.5, 0.95, 0.99)


class CorrectionConfig(BaseModel):
    """Rollout correction (`TorchTrainerConfig.correction`): TIS weights and masks from the
    ratio of the trainer's logprobs before the update to the engine's recorded ones."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tis_cap: float | None = Field(2.0, ge=1)
    """Token-level truncated importance sampling: the behaviour weight pi_prox / pi_behav of
    decoupled PPO is cut to at most this (C = 2 as in verl's `rollout_is_threshold` default and
    the TIS paper). Applied after `behav_cap`'s filter. None: the weight is not truncated.
    Decoupled PPO only: ppo_clip's ratio is already against the behaviour policy (and clipped)."""
    token_mask: tuple[float, float] | None = None
    """[low, high]: tokens whose ratio pi_prox / pi_behav is outside it are masked (weight 0),
    e.g. [0.125, 8.0] (prime-rl's defaults). None: no token masking."""
    seq_mask: tuple[float, float] | None = None
    """[low, high]: a sequence (one segment) whose geometric-mean token ratio
    exp(mean over its sampled tokens of log(pi_prox / pi_behav)) is outside it is masked whole,
    e.g. [0.5, 2.0]. None: no sequence masking."""

    @model_validator(mode="after")
    def _bands(self) -> "CorrectionConfig":
        for name in ("token_mask", "seq_mask"):
            band = getattr(self, name)
            if band is not None and not 0 < band[0] <= 1 <= band[1]:
                raise ValueError(f"{name}: {list(band)} must be [low, high] with 0 < low <= 1 <= high "
                                 "(a ratio of 1, no mismatch, is always kept)")
        return self


class SeqKeep(NamedTuple):
    keep: Tensor
    """[rows] bool: the row's geometric-mean ratio is inside the band (rows without a sampled token are kept)."""
    log_ratio: Tensor
    """[rows] mean over the row's masked tokens of δ (0 for a row without one): log of the geometric mean."""


def log_ratio(logp_prox: Tensor, logp_behav: Tensor) -> Tensor:
    """δ = logp_prox - logp_behav, detached, clamped to ±LOG_RATIO_CLAMP (as the losses clamp it)."""
    return torch.clamp(logp_prox.detach() - logp_behav.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_band_keep(delta: Tensor, band: tuple[float, float] | None) -> Tensor:
    """Bool: low <= exp(δ) <= high per token, compared in log space; all True when band is None."""
    if band is None:
        return torch.ones_like(delta, dtype=torch.bool)
    low, high = band
    return (delta >= torch.log(torch.tensor(low, dtype=delta.dtype))) & (
        delta <= torch.log(torch.tensor(high, dtype=delta.dtype)))


def geo_mean_keep(delta: Tensor, mask: Tensor, band: tuple[float, float] | None) -> SeqKeep:
    """Per row: g = exp(Σ_t m_t δ_t / Σ_t m_t) and whether low <= g <= high (module doc).

    Rows are the first dimension; positions the last. A row with no masked token has g = 1.
    band None keeps every row (g is still returned for the metrics)."""
    m = mask.to(delta.dtype)
    mean = (delta * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return SeqKeep(token_band_keep(mean, band), mean)


def keep_mask(delta: Tensor, mask: Tensor, config: CorrectionConfig) -> tuple[Tensor, Tensor, SeqKeep]:
    """(keep, token_keep, seq): keep = token_keep AND its row's seq.keep, per token [rows, positions]."""
    token_keep = token_band_keep(delta, config.token_mask)
    seq = geo_mean_keep(delta, mask, config.seq_mask)
    return token_keep & seq.keep[:, None], token_keep, seq


def ratio_summary(abs_delta: Tensor) -> dict[str, float] | None:
    """{mean, p50, p95, p99, max} of |δ| over the tokens given (a flat tensor); None if empty.

    Quantiles by linear interpolation between order statistics (`torch.quantile`'s default,
    computed on the sorted values: `torch.quantile` refuses more than 16M elements)."""
    if abs_delta.numel() == 0:
        return None
    x = torch.sort(abs_delta.detach().double().flatten().cpu()).values
    out = {"mean": float(x.mean())}
    for q in QUANTILES:
        pos = q * (x.numel() - 1)
        lo = int(pos)
        hi = min(lo + 1, x.numel() - 1)
        out[f"p{round(q * 100)}"] = float(x[lo] + (x[hi] - x[lo]) * (pos - lo))
    out["max"] = float(x[-1])
    return out


class Tally:
    """One step's correction figures, fed once per micro-batch (each trained token once):
    `metrics()` gives the `StepMetrics` fields of the same names."""

    def __init__(self) -> None:
        self.abs: list[Tensor] = []
        self.seq_log: list[Tensor] = []
        self.tokens = self.truncated = self.token_masked = self.masked = self.seqs = self.seq_masked = 0

    def add(self, delta: Tensor, mask: Tensor, truncated: Tensor, token_keep: Tensor, keep: Tensor, seq: SeqKeep) -> None:
        m = mask > 0
        rows = m.any(-1)
        self.abs.append(delta[m].abs().detach().cpu())
        self.seq_log.append(seq.log_ratio[rows].detach().cpu())
        self.tokens += int(m.sum())
        self.truncated += int((truncated & m).sum())
        self.token_masked += int((~token_keep & m).sum())
        self.masked += int((~keep & m).sum())
        self.seqs += int(rows.sum())
        self.seq_masked += int((~seq.keep & rows).sum())

    def metrics(self) -> dict[str, float | None]:
        summary = ratio_summary(torch.cat(self.abs)) if self.abs else None
        seq = torch.cat(self.seq_log) if self.seq_log else torch.empty(0)
        frac = (lambda n, d: n / d if d else 0.0)
        return {
            "tis_truncated_frac": frac(self.truncated, self.tokens),
            "token_masked_frac": frac(self.token_masked, self.tokens),
            "seq_masked_frac": frac(self.seq_masked, self.seqs),
            "masked_frac": frac(self.masked, self.tokens),
            **{f"log_ratio_abs_{k}": (summary or {}).get(k) for k in ("mean", "p50", "p95", "p99", "max")},
            "seq_ratio_min": float(seq.min().exp()) if seq.numel() else None,
            "seq_ratio_max": float(seq.max().exp()) if seq.numel() else None,
        }
