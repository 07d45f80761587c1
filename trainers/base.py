"""The trainer contract: trajectories in, one update, weights out with a new version.

A `Trainer` takes a batch of `harnessrl.gym.trajectory.Trajectory` records, validates them
where they enter, turns them into training samples (`harnessrl.trainers.samples`), applies
one update and reports a `StepMetrics`. `publish(out_dir)` writes the current weights as a
Hugging Face folder (safetensors + tokenizer) that an engine can load with
`/update_weights_from_disk`, and returns their integer version; the engine stamps that
version on every token it samples afterwards, which is how staleness is measured.

Versions count weight updates: the initial weights (which the engine starts with) are
version 0 and every step that updates the policy bumps the version by one; `publish`
stamps the current version (publishing twice without a step gives the same number).
The staleness of a trained token is (the version being updated) - (the version that
sampled it): the number of policy updates between sampling it and training on it,
whatever the publish cadence. In the main loop's step-then-publish rhythm this is the
same as counting publishes.

The behaviour policy is in the record, not in a trainer's config: every sampled token's
`Sample.temperature` / `top_p` / `top_k` (from its call's `flags["sampling"]`, read by
`trainers.behaviour`) name the distribution its engine logprob belongs to, and a trainer
must recompute that logprob in exactly that distribution
(`trainers.engine.sampling.processed_logprobs`, as `batching.token_logprobs` does), or
refuse the batch. `build_samples` already refuses greedy and unrecorded calls.

Implementations satisfy the Protocols structurally; they do not inherit from them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, runtime_checkable

from harnessrl.gym.trajectory import Trajectory
from harnessrl.registry import choice, resolve


@dataclass
class StepMetrics:
    """What one `Trainer.step` did, one line of the main job's log."""

    step: int
    """Optimizer steps taken so far, including this one."""
    version: int
    """Policy version after the step (what `publish` would stamp now); staleness is measured
    against the version before it, the one that was updated."""
    updated: bool
    """False when the batch had no trainable token, so no optimizer update happened."""
    loss: float
    """Total loss of the batch (policy-gradient + kl_coef * kl), as normalized for the update."""
    pg_loss: float
    """Policy-gradient part of the loss."""
    grad_norm: float
    """Global gradient L2 norm before clipping (mean over the step's optimizer updates)."""
    kl: float | None
    """k3 estimate of KL(policy || reference) per trained token; None when no reference model."""
    kl_behaviour: float
    """k3 estimate of KL(trainer's pre-update policy || engine's sampling policy) per trained token."""
    clip_frac: float
    """Fraction of trained tokens whose ratio was clipped (and the clip was active)."""
    behav_filtered_frac: float
    """Decoupled PPO only: fraction of tokens whose behaviour weight exceeded the cap
    (masked or capped, per config); 0.0 for plain PPO-clip."""
    logprob_mismatch_mean: float | None
    """Mean |trainer logprob - engine logprob| over fresh tokens (sampled by the current
    version), before the update: the train/inference fidelity number. None if no fresh token."""
    logprob_mismatch_max: float | None
    """Max of the same."""
    mismatch_tokens: int
    """How many fresh tokens the mismatch was measured on."""
    staleness_max: int
    """Max over trained tokens of (current version - version that sampled the token)."""
    staleness_mean: float
    """Mean of the same."""
    tokens: int
    """Trained (sampled, unmasked) tokens in the batch."""
    samples: int
    """Training samples (segments with at least one sampled token)."""
    trajectories: int
    """Trajectories that entered the loss."""
    masked_infra: int
    """Trajectories masked out because the infrastructure failed (infra_error or no reward)."""
    dropped_truncated: int
    """Truncated trajectories dropped by `SampleConfig.truncated == "drop"`."""
    reward_mean: float | None
    """Mean reward over scored trajectories (infra failures excluded); None if none scored."""
    success_rate: float | None
    """Fraction of scored trajectories with reward >= SampleConfig.success_threshold."""
    lr: float
    """Learning rate used by the last optimizer update of the step."""
    step_s: float
    """Wall-clock seconds the step took."""
    # Rollout correction (`trainers.correction`), over the step's trained tokens, each once. The
    # ratio is pi_prox / pi_behav: the trainer before the update against the engine's record
    # (numerics, plus the policy change for stale tokens). Trainers without it leave the defaults.
    tis_truncated_frac: float = 0.0
    """Share of trained tokens whose behaviour weight was cut to `correction.tis_cap`."""
    token_masked_frac: float = 0.0
    """Share of trained tokens masked by `correction.token_mask` (ratio outside the band)."""
    seq_masked_frac: float = 0.0
    """Share of sequences (segments with a trained token) masked by `correction.seq_mask`."""
    masked_frac: float = 0.0
    """Share of trained tokens with no gradient from the correction: token- or sequence-masked."""
    log_ratio_abs_mean: float | None = None
    """Mean over trained tokens of |log(pi_prox / pi_behav)|; None when no update."""
    log_ratio_abs_p50: float | None = None
    """Median of the same."""
    log_ratio_abs_p95: float | None = None
    """95th percentile of the same."""
    log_ratio_abs_p99: float | None = None
    """99th percentile of the same."""
    log_ratio_abs_max: float | None = None
    """Max of the same: exp(this) is the largest weight TIS saw before truncation (or its inverse)."""
    seq_ratio_min: float | None = None
    """Smallest geometric-mean ratio of a sequence (what `correction.seq_mask` compares)."""
    seq_ratio_max: float | None = None
    """Largest geometric-mean ratio of a sequence."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Trainer(Protocol):
    """Takes trajectories, updates the policy, publishes weights with a version."""

    @property
    def version(self) -> int:
        """Version of the current weights: 0 initially, +1 per update (see module doc)."""
        ...

    def step(self, batch: list[Trajectory]) -> StepMetrics:
        """Validate `batch`, build samples, apply one update, scoring each token in its
        recorded sampling distribution (module doc); raises ValueError naming the session,
        segment and field of a malformed, greedy or unrecorded record."""
        ...

    def publish(self, out_dir: str | Path) -> int:
        """Write the current weights + tokenizer into `out_dir` (a loadable HF folder,
        written atomically) and return their version."""
        ...


@runtime_checkable
class Checkpointable(Protocol):
    """A trainer whose whole state (weights, optimizer, step, version, RNG) round-trips."""

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path: ...

    def load_checkpoint(self, ckpt_dir: str | Path) -> None: ...


@runtime_checkable
class TensorPublisher(Protocol):
    """A trainer that can hand its weights over in memory (colocated engine,
    `/update_weights_from_tensor`) instead of through a folder."""

    def named_weights(self) -> Iterator[tuple[str, Any]]: ...


#: Short trainer names to "module:Class"; a full "module:Class" path is accepted too.
#: `harnessrl train` builds the one its config names (`TrainConfig.trainer_name`) with the
#: class's `for_run(train_config)`; a trainer with a `backend` samples through it (the proxy
#: generates there) and publishes with its `weight_sync()`, any other samples on the engine.
TRAINERS: dict[str, str] = {
    "torch": "harnessrl.trainers.torch_trainer:TorchTrainer",
    "tinker": "harnessrl.trainers.bridges.tinker:TinkerTrainer",
}

#: A trainer's name as a config field, validated against `TRAINERS` (or a "module:Class" path).
TrainerName = choice(TRAINERS, "trainer")


def trainer_class(name: str) -> type:
    """The trainer class for a short name or a "module:Class" path, imported lazily."""
    return resolve(TRAINERS, name, "trainer", error=KeyError)
