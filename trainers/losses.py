"""Policy losses as pure functions of tensors.

Every function takes per-token tensors of one shape (any shape; the trainer uses
[batch, positions]) and returns per-token values; `aggregate` turns them into the scalar
that is differentiated. Log-probabilities are natural-log probabilities of the sampled
tokens. Nothing here reads a config, a model or a global.

Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before `exp`: a token that
is 20 nats off-policy is clipped or masked anyway, and an `inf` ratio would turn the
zero gradient of the clipped branch into `0 * inf = nan`.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0


class PolicyLoss(NamedTuple):
    per_token: Tensor
    """Loss of each token (to be minimized), before masking and normalization."""
    clipped: Tensor
    """Bool: the clipped branch of the PPO min was chosen and differs from the unclipped one."""
    behav_filtered: Tensor
    """Bool: decoupled PPO's behaviour weight exceeded the cap (capped or masked)."""
    truncated: Tensor
    """Bool: decoupled PPO's behaviour weight exceeded `tis_cap` and was cut to it (TIS)."""


def _ratio(logp_num: Tensor, logp_den: Tensor) -> Tensor:
    return torch.exp(torch.clamp(logp_num - logp_den, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """-min(r A, clip(r, 1-clip_low, 1+clip_high) A) and where the clip was active."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    # Active exactly when the clipped term is the smaller one: r > 1+eh with A > 0,
    # or r < 1-el with A < 0.
    active = clipped < unclipped
    return -torch.minimum(unclipped, clipped), active


def ppo_clip_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    keep: Tensor | None = None,
) -> PolicyLoss:
    """PPO-clip, token level (the GRPO surrogate), no KL term, no importance weight beyond r.

    per_token = -min(r·A, clip(r, 1-clip_low, 1+clip_high)·A), r = exp(logp - logp_old).
    `logp_old` is the policy the tokens are treated as sampled from: the engine's
    behaviour logprobs from the record. With `logp_old = logp.detach()` (one on-policy
    update) r = 1 and the gradient is -A·∇logp, GRPO's token-level policy gradient.
    `clip_high > clip_low` is DAPO's asymmetric "clip-higher". Advantages are per token
    (an outcome advantage broadcast over the sequence). `keep` (bool, rollout correction's
    token and sequence masks: `trainers.correction`) sets the loss of the tokens it drops to 0.
    """
    ratio = _ratio(logp, logp_old.detach())
    per_token, active = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    if keep is not None:
        per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    none = torch.zeros_like(active)
    return PolicyLoss(per_token, active, none, none)


def decoupled_ppo_loss(
    logp: Tensor,
    logp_prox: Tensor,
    logp_behav: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    behav_cap: float | None = 5.0,
    behav_mode: Literal["cap", "mask"] = "mask",
    tis_cap: float | None = None,
    keep: Tensor | None = None,
) -> PolicyLoss:
    """Decoupled PPO (AReaL, arXiv 2505.24298, Eq. 5), token level, no KL term.

    per_token = -w · min(u·A, clip(u, 1-clip_low, 1+clip_high)·A), with
    u = exp(logp - logp_prox): the trust region is around the proximal policy (the
    trainer's policy before this update, recomputed by a forward pass), and
    w = exp(logp_prox - logp_behav): the importance weight from the behaviour policy (the
    engine's logprobs from the record, possibly several versions in one trajectory) to
    the proximal one. w is a constant (no gradient flows through it).

    When w > behav_cap: "mask" sets w = 0 (the token drops out of the gradient but still
    counts in the normalization denominator, as in AReaL's implementation); "cap" sets
    w = behav_cap (truncated importance sampling). behav_cap None disables both.

    Rollout correction (`trainers.correction`), after that filter: `tis_cap` C truncates the
    weight, w = min(w, C) (token-level TIS; `truncated` marks where w > C); `keep` (bool: the
    token and sequence masks) sets w = 0 where False. With both None the loss is unchanged.
    """
    w = _ratio(logp_prox.detach(), logp_behav.detach())
    if behav_cap is None:
        filtered = torch.zeros_like(w, dtype=torch.bool)
    else:
        filtered = w > behav_cap
        if behav_mode == "mask":
            w = torch.where(filtered, torch.zeros_like(w), w)
        elif behav_mode == "cap":
            w = torch.clamp(w, max=behav_cap)
        else:
            raise ValueError(f"behav_mode {behav_mode!r} must be 'cap' or 'mask'")
    truncated = torch.zeros_like(filtered) if tis_cap is None else w > tis_cap
    if tis_cap is not None:
        w = torch.clamp(w, max=tis_cap)
    if keep is not None:
        w = torch.where(keep, w, torch.zeros_like(w))
    u = _ratio(logp, logp_prox.detach())
    surrogate, active = _clipped_surrogate(u, advantages, clip_low, clip_high)
    return PolicyLoss(w * surrogate, active, filtered, truncated)


def kl_k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(π_θ || π_ref) per token (the one GRPO uses).

    k3 = exp(δ) - δ - 1 with δ = logp_ref - logp: non-negative, unbiased when the token was
    drawn from π_θ (here approximately: tokens come from the behaviour policy). Gradient
    w.r.t. logp is 1 - exp(δ). δ is clamped to ±LOG_RATIO_CLAMP.
    """
    delta = torch.clamp(logp_ref.detach() - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(delta) - delta - 1.0


def aggregate(
    values: Tensor,
    mask: Tensor,
    *,
    mode: Literal["token", "sequence"],
    seq_weight: Tensor | None = None,
    denominator: float | Tensor | None = None,
) -> Tensor:
    """Reduce per-token values [rows, positions] to a scalar over masked tokens.

    "token": Σ_t m_t·v_t / denominator, every masked token counts once (DAPO / Dr. GRPO
    token-level). denominator defaults to Σ m_t; pass the whole batch's token count when
    the batch is split into micro-batches so their losses add up to the batch loss.
    "sequence": Σ_s w_s·(Σ_t m_t·v_t / n_s) / denominator, each row's masked mean weighted
    by seq_weight w_s (default 1); denominator defaults to Σ_s w_s (the GRPO paper's
    1/G Σ_i 1/|o_i| Σ_t when all w_s = 1). A row with n_s = 0 contributes 0.
    """
    mask = mask.to(values.dtype)
    if mode == "token":
        total = (values * mask).sum()
        denom = mask.sum().clamp(min=1.0) if denominator is None else denominator
        return total / denom
    if mode == "sequence":
        if seq_weight is None:
            seq_weight = torch.ones(values.shape[0], dtype=values.dtype, device=values.device)
        row_mean = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        denom = seq_weight.sum().clamp(min=1e-12) if denominator is None else denominator
        return (seq_weight * row_mean).sum() / denom
    raise ValueError(f"normalization mode {mode!r} must be 'token' or 'sequence'")
