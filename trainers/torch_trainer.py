"""The built-in trainer: plain torch + transformers, GRPO / decoupled PPO, one process.

`sft_step(batch)` trains on teacher records (`trainers.sft`: masked token-mean
cross-entropy) with the same shards, micro-batches, clipping and optimizer.

One `step(batch)`:
1. validate the records and build samples (`samples.build_samples`, versions checked
   against this trainer's version);
2. shuffle the samples into `minibatches` shards (one optimizer update each, `epochs`
   passes), each shard into micro-batches by token budget;
3. when a step makes more than one update, a no-grad pass first computes the proximal
   logprobs (the policy before this step's first update) and, with a KL term, the
   reference logprobs; with one update the proximal logprobs are the detached logprobs of
   the gradient pass itself (same weights, same numbers, one forward pass saved);
4. per micro-batch: recompute the current policy's logprobs of the sampled tokens in the
   distribution each token's record names (its call's temperature, and top-p/top-k where
   the engine's logprobs are of the filtered distribution: `trainers.behaviour`), the
   rollout correction from the proximal-to-behaviour ratio (`trainers.correction`: TIS
   weight, token and sequence masks; its figures counted once per token), the loss (see
   `losses`) normalized by the whole shard's token count or trajectory weight so
   micro-batches add up, backward; then clip the gradient norm and step AdamW.
The fidelity number, |trainer logprob - engine logprob|, is measured before any update on
tokens sampled by the current version (older tokens differ by the policy change itself).

With `lora`, only peft adapters train (`trainers.lora`); checkpoints hold the adapter, `publish`
writes merged full weights and `publish_adapter` the adapter alone (`trainers.lora_sync`).

bf16 is autocast (fp32 master weights): by default on a CUDA device that supports it,
on CPU only when asked for; CPU trains in float32 by default. Logprobs are always taken
from float32 logits.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Iterator, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers import checkpoint, lora
from harnessrl.trainers.base import StepMetrics
from harnessrl.trainers.batching import MicroBatch, collate, plan_micro_batches, token_logprobs
from harnessrl.trainers.correction import CorrectionConfig, Tally, keep_mask, log_ratio
from harnessrl.trainers.lora import LoraConfig
from harnessrl.trainers.losses import aggregate, decoupled_ppo_loss, kl_k3, ppo_clip_loss
from harnessrl.trainers.samples import Sample, SampleConfig, build_samples
from harnessrl.trainers.trainable import freeze_below, load_model


class TorchTrainerConfig(BaseModel):
    """The built-in torch trainer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = "smollm2-135m"
    """Prepared model name or folder (`harnessrl.gym.models.resolve_model`)."""
    ref_model: str | None = None
    """Reference model for the KL term; None means the initial weights of `model`. Loaded only when kl_coef > 0."""
    device: str = "auto"
    """"auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: "bfloat16" autocasts (fp32 master weights, fp32 logprobs); "auto" picks
    bf16 on a CUDA device that supports it and float32 otherwise (CPU)."""
    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warmup over this many optimizer updates, then constant."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; None disables clipping (the norm is still reported)."""
    micro_batch_tokens: int = Field(4096, gt=0)
    """Token budget of a micro-batch: rows x longest row (padding included)."""
    minibatches: int = Field(1, ge=1)
    """Optimizer updates per pass over the batch (the batch is shuffled into this many shards)."""
    epochs: int = Field(1, ge=1)
    """Passes over the batch per step."""
    trainable_layers: int | None = Field(None, ge=1)
    """Train only the top N transformer blocks (and the final norm); the embeddings (tied to the
    LM head in SmolLM2) and the blocks below are frozen, so the backward pass stops at block
    L - N: on a CPU an update of a 1.5k-token trajectory costs about the forward pass plus N/L
    of the backward. None: every parameter trains."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    temperature: float = Field(1.0, gt=0)
    """Temperature for records that do not say how they sampled (trajectories without call
    records, e.g. hand-built segments). A recorded call is always scored at its own sampling
    (`flags["sampling"]`: temperature, top_p, top_k, logprob space; see `trainers.behaviour`),
    whatever this says; greedy records are refused."""
    policy_loss: Literal["ppo_clip", "decoupled_ppo"] = "decoupled_ppo"
    """"ppo_clip": ratio against the engine's behaviour logprobs. "decoupled_ppo": AReaL Eq. 5,
    trust region around the proximal policy, behaviour importance weight capped or masked."""
    clip_low: float = Field(0.2, ge=0, lt=1)
    """PPO clip range below 1: ratios under 1 - clip_low are clipped (when A < 0)."""
    clip_high: float = Field(0.2, ge=0)
    """PPO clip range above 1 (DAPO's clip-higher when larger than clip_low)."""
    behav_cap: float | None = Field(5.0, gt=1)
    """Decoupled PPO: cap on the behaviour weight pi_prox / pi_behav; None for no cap."""
    behav_mode: Literal["mask", "cap"] = "mask"
    """Decoupled PPO: a token whose behaviour weight exceeds behav_cap is masked (AReaL) or capped (truncated IS)."""
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    """Rollout correction against the engine's numerics (`trainers.correction`): token-level
    truncated importance sampling (`tis_cap`), token masking (`token_mask`) and sequence masking
    by the geometric-mean ratio (`seq_mask`); every step reports the ratio's distribution."""
    normalization: Literal["token", "sequence"] = "token"
    """"token": every sampled token in the shard counts once. "sequence": each trajectory
    counts once (its mean token loss), split over its segments by SampleConfig.segment_weighting."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the k3 KL(policy || reference) term; 0 loads no reference model."""
    seed: int = 0
    """Seed of the trainer's own generator (the shuffle into minibatches) and of the order the
    sft stage takes teacher records in (`sft.shuffle`)."""
    samples: SampleConfig = Field(default_factory=SampleConfig)
    """How trajectories become samples: advantages, weights, truncated episodes."""
    lora: LoraConfig | None = None
    """Train low-rank adapters (peft) instead of every weight: rank, alpha, dropout, target
    modules (`trainers.lora.LoraConfig`). None: full fine-tuning. Not combined with
    `trainable_layers`."""

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"{v!r} is not 'auto', 'cpu', 'cuda' or 'cuda:N'")
        return v

    @model_validator(mode="after")
    def _lora_alone(self) -> "TorchTrainerConfig":
        if self.lora is not None and self.trainable_layers is not None:
            raise ValueError("lora: set either lora or trainable_layers, not both (lora freezes the base model)")
        return self


class TorchTrainer:
    """GRPO / decoupled-PPO trainer on one device; satisfies Trainer, Checkpointable, TensorPublisher."""

    Config = TorchTrainerConfig
    """The config class, so a composition root can do `cls(cls.Config(**section))`."""

    @classmethod
    def for_run(cls, run: Any) -> "TorchTrainer":
        """The trainer of a `harnessrl train` run (`TrainConfig`): its `trainer` section, on its `model`."""
        return cls(run.trainer.model_copy(update={"model": run.model}))

    def __init__(self, config: TorchTrainerConfig | None = None):
        self.config = config = config or TorchTrainerConfig()
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)
        cuda_bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        if config.dtype == "bfloat16" and self.device.type == "cuda" and not cuda_bf16:
            raise ValueError(f"dtype 'bfloat16': {self.device} does not support bf16; use 'float32'")
        # "auto" means bf16 only where it pays (a bf16-capable GPU); CPU bf16 autocast works
        # but is slow without AMX/AVX512-bf16, so CPU gets it only when asked for.
        use_bf16 = config.dtype == "bfloat16" or (config.dtype == "auto" and cuda_bf16)
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None
        self.model, self.model_path = load_model(config.model, self.device)
        self.model.config.use_cache = False
        if config.trainable_layers is not None:
            freeze_below(self.model, config.trainable_layers)
        if config.lora is not None:
            self.model = lora.wrap(self.model, config.lora, seed=config.seed)
        if config.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref_model = None
        if config.kl_coef > 0:
            self.ref_model, _ = load_model(config.ref_model or config.model, self.device)
            self.ref_model.eval().requires_grad_(False)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        cfg = self.model.config
        self.pad_id = next((x for x in (cfg.pad_token_id, cfg.eos_token_id, 0) if isinstance(x, int)), 0)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr, betas=config.betas, eps=config.adam_eps, weight_decay=config.weight_decay,
        )
        warm = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warm) if warm else 1.0
        )
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step_count = 0
        self._version = 0

    # -- Trainer -------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def step(self, batch: list[Trajectory]) -> StepMetrics:
        t0 = time.perf_counter()
        cfg = self.config
        sb = build_samples(batch, cfg.samples, current_version=self._version, vocab_size=self.vocab_size,
                           temperature=cfg.temperature)
        samples = sb.samples
        tokens = sum(s.n_sampled for s in samples)
        stale = [self._version - v for s in samples for v, m in zip(s.versions, s.loss_mask) if m]
        acc, tally = _Accumulator(), Tally()
        updated = tokens > 0
        if updated:
            shards_per_epoch = [self._shards(samples) for _ in range(cfg.epochs)]
            plans = [[self._micro_batches(shard) for shard in shards] for shards in shards_per_epoch]
            n_updates = sum(len(p) for p in plans)
            if n_updates > 1 or self.ref_model is not None:
                self._before_update(plans, acc, recompute_prox=n_updates > 1)
            for epoch, epoch_plans in enumerate(plans):
                for micro_batches in epoch_plans:
                    self._update(micro_batches, acc, tally if epoch == 0 else None)  # each token once
            self.step_count += 1
            self._version += 1  # new weights, a new policy version (publish stamps it)
        return StepMetrics(
            step=self.step_count,
            version=self._version,
            updated=updated,
            loss=acc.mean("loss"),
            pg_loss=acc.mean("pg_loss"),
            grad_norm=acc.mean("grad_norm"),
            kl=acc.ratio("kl_sum", "kl_tokens") if self.ref_model is not None and updated else None,
            kl_behaviour=acc.ratio("kl_behav_sum", "pre_tokens"),
            clip_frac=acc.ratio("clipped", "trained_tokens"),
            behav_filtered_frac=acc.ratio("filtered", "trained_tokens"),
            logprob_mismatch_mean=acc.ratio("mismatch_sum", "mismatch_tokens") if acc.get("mismatch_tokens") else None,
            logprob_mismatch_max=acc.get("mismatch_max") if acc.get("mismatch_tokens") else None,
            mismatch_tokens=int(acc.get("mismatch_tokens")),
            staleness_max=max(stale, default=0),
            staleness_mean=sum(stale) / len(stale) if stale else 0.0,
            tokens=tokens,
            samples=len(samples),
            trajectories=sb.trajectories,
            masked_infra=sb.masked_infra,
            dropped_truncated=sb.dropped_truncated,
            reward_mean=sb.reward_mean,
            success_rate=sb.success_rate,
            lr=self.optimizer.param_groups[0]["lr"] if not updated else acc.get("lr"),
            step_s=time.perf_counter() - t0,
            **tally.metrics(),
        )

    def sft_step(self, batch: list[Trajectory], min_reward: float | None = 1.0, lr: float | None = None) -> dict:
        """One SFT step on teacher records (`trainers.sft`): the same shards, micro-batches,
        gradient clipping and AdamW as `step`, the masked token-mean cross-entropy as the loss.
        New weights are a new policy version. Returns the step's metrics; `loss` is the
        update's loss before it (mean over its shards). `lr`: this step's learning rate instead of
        the schedule's (the schedule sets it back at its next step)."""
        from harnessrl.trainers.sft import sft_loss, sft_samples

        t0 = time.perf_counter()
        samples = sft_samples(batch, vocab_size=self.vocab_size, min_reward=min_reward)
        tokens = sum(s.n_sampled for s in samples)
        losses, norms = [], []
        if tokens:
            self.model.train()
            for shard in self._shards(samples):
                mbs = self._micro_batches(shard)
                denom = float(sum(mb.mask.sum().item() for mb in mbs))
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for mb in mbs:
                    with self._autocast():
                        logp = token_logprobs(self.model, mb)
                    loss = sft_loss(logp, mb.mask, denom)
                    loss.backward()
                    total += loss.item()
                params = [p for p in self.model.parameters() if p.grad is not None]
                limit = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
                norms.append(torch.nn.utils.clip_grad_norm_(params, limit).item())
                if lr is not None:
                    for g in self.optimizer.param_groups:
                        g["lr"] = lr
                self.optimizer.step()
                self.scheduler.step()
                losses.append(total)
            self.step_count += 1
            self._version += 1
        return {"stage": "sft", "step": self.step_count, "version": self._version, "updated": bool(tokens),
                "loss": sum(losses) / len(losses) if losses else None,
                "grad_norm": sum(norms) / len(norms) if norms else None, "tokens": tokens, "samples": len(samples),
                "trajectories": len({s.session_id for s in samples}),
                "lr": lr if lr is not None else self.optimizer.param_groups[0]["lr"],
                "step_s": time.perf_counter() - t0}

    def publish(self, out_dir: str | Path) -> int:
        """save_pretrained (safetensors) + tokenizer into `out_dir`, atomically; returns the
        version of these weights (bumped by each update, so publishing twice without a step
        gives the same version twice)."""
        from harnessrl.gym.models import load_tokenizer
        from harnessrl.trainers.model_prep import label_tokenizer_verbatim

        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.atomic_dir(out)
        if self.config.lora is None:
            self.model.save_pretrained(tmp, safe_serialization=True)
        else:  # the adapter folded into full weights, for engines that load only whole models
            lora.save_merged(self.model, tmp)
        # tokenizer.json as the model has it, labelled so any transformers (or SGLang) loads it as is
        load_tokenizer(str(self.model_path)).save_pretrained(tmp)
        label_tokenizer_verbatim(tmp)
        (tmp / "harnessrl_version.json").write_text(f'{{"version": {self._version}, "step": {self.step_count}}}\n')
        checkpoint.commit_dir(tmp, out)
        return self._version

    def publish_adapter(self, out_dir: str | Path) -> int:
        """LoRA only: the adapter's peft folder (adapter_config.json + adapter_model.safetensors,
        no base weights) into `out_dir`, atomically; returns the version, as `publish`."""
        if self.config.lora is None:
            raise ValueError("publish_adapter: this trainer has no lora config; use publish")
        lora.publish_adapter(self.model, Path(out_dir), version=self._version, step=self.step_count)
        return self._version

    # -- Checkpointable / TensorPublisher -----------------------------------------------

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        state = {  # with lora, the adapter only: the base weights are the model's own files
            "model": self.model.state_dict() if self.config.lora is None else lora.adapter_state(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
        meta = {"step": self.step_count, "version": self._version, "config": self.config.model_dump(mode="json")}
        return checkpoint.save(Path(ckpt_dir), state=state, meta=meta)

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        state, meta = checkpoint.load(Path(ckpt_dir), self.device)
        if self.config.lora is None:
            self.model.load_state_dict(state["model"])
        else:
            lora.load_adapter_state(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.step_count, self._version = int(meta["step"]), int(meta["version"])

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.config.lora is not None:  # the policy as full weights under the base model's names
            yield from lora.merged_state_dict(self.model).items()
            return
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    # -- internals -----------------------------------------------------------------------

    def _shards(self, samples: list[Sample]) -> list[list[Sample]]:
        n = self.config.minibatches
        if n == 1:
            return [samples]
        order = torch.randperm(len(samples), generator=self.generator).tolist()
        shards = [[samples[i] for i in order[k::n]] for k in range(n)]
        return [s for s in shards if any(x.n_sampled for x in s)]

    def _micro_batches(self, shard: list[Sample]) -> list[MicroBatch]:
        plan = plan_micro_batches(shard, self.config.micro_batch_tokens)
        return [collate([shard[i] for i in idx], self.pad_id, self.device) for idx in plan]

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _pre_update_stats(self, mb: MicroBatch, logp: torch.Tensor, acc: "_Accumulator") -> None:
        """Fidelity and behaviour-KL, from logprobs of the policy before any update."""
        m = mb.mask > 0
        fresh = m & (mb.versions == self._version)
        diff = (logp - mb.behav_logprobs).abs()[fresh]
        if diff.numel():
            acc.add("mismatch_sum", diff.sum().item())
            acc.add("mismatch_tokens", diff.numel())
            acc.put_max("mismatch_max", diff.max().item())
        acc.add("kl_behav_sum", kl_k3(logp, mb.behav_logprobs)[m].sum().item())
        acc.add("pre_tokens", int(m.sum().item()))

    @torch.no_grad()
    def _before_update(self, plans, acc: "_Accumulator", recompute_prox: bool) -> None:
        """Proximal and reference logprobs for every micro-batch of the step, before any update."""
        self.model.eval()
        for epoch, epoch_plans in enumerate(plans):
            for mb in (mb for shard in epoch_plans for mb in shard):
                with self._autocast():
                    if recompute_prox:
                        mb.prox_logprobs = token_logprobs(self.model, mb)
                    if self.ref_model is not None:
                        mb.ref_logprobs = token_logprobs(self.ref_model, mb)
                if recompute_prox and epoch == 0:  # each sample once
                    self._pre_update_stats(mb, mb.prox_logprobs, acc)

    def _update(self, micro_batches: list[MicroBatch], acc: "_Accumulator", tally: Tally | None) -> None:
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if cfg.normalization == "token":
            denom = float(sum(mb.mask.sum().item() for mb in micro_batches))
        else:
            denom = float(sum(mb.seq_weight.sum().item() for mb in micro_batches))
        loss_total = pg_total = 0.0
        for mb in micro_batches:
            with self._autocast():
                logp = token_logprobs(self.model, mb)
            if mb.prox_logprobs is None:  # single update: these weights are the proximal policy
                mb.prox_logprobs = logp.detach()
                self._pre_update_stats(mb, mb.prox_logprobs, acc)
            delta = log_ratio(mb.prox_logprobs, mb.behav_logprobs)
            keep, token_keep, seq = keep_mask(delta, mb.mask, cfg.correction)
            if cfg.policy_loss == "decoupled_ppo":
                pl = decoupled_ppo_loss(
                    logp, mb.prox_logprobs, mb.behav_logprobs, mb.advantages,
                    clip_low=cfg.clip_low, clip_high=cfg.clip_high, behav_cap=cfg.behav_cap, behav_mode=cfg.behav_mode,
                    tis_cap=cfg.correction.tis_cap, keep=keep,
                )
            else:
                pl = ppo_clip_loss(logp, mb.behav_logprobs, mb.advantages, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                   keep=keep)
            if tally is not None:
                tally.add(delta, mb.mask, pl.truncated, token_keep, keep, seq)
            agg = dict(mode=cfg.normalization, seq_weight=mb.seq_weight, denominator=denom)
            pg = aggregate(pl.per_token, mb.mask, **agg)
            loss = pg
            if self.ref_model is not None:
                kl = kl_k3(logp, mb.ref_logprobs)
                loss = loss + cfg.kl_coef * aggregate(kl, mb.mask, **agg)
                acc.add("kl_sum", (kl.detach() * mb.mask).sum().item())
                acc.add("kl_tokens", mb.tokens)
            loss.backward()
            loss_total += loss.item()
            pg_total += pg.item()
            m = mb.mask > 0
            acc.add("clipped", int((pl.clipped & m).sum().item()))
            acc.add("filtered", int((pl.behav_filtered & m).sum().item()))
            acc.add("trained_tokens", int(m.sum().item()))
        params = [p for p in self.model.parameters() if p.grad is not None]
        limit = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, limit).item()
        acc.put("lr", self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        acc.append("loss", loss_total)
        acc.append("pg_loss", pg_total)
        acc.append("grad_norm", grad_norm)


class _Accumulator:
    """Sums, maxima and per-update lists for one step's metrics."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self.lists: dict[str, list[float]] = {}

    def add(self, key: str, x: float) -> None:
        self.values[key] = self.values.get(key, 0.0) + x

    def put(self, key: str, x: float) -> None:
        self.values[key] = x

    def put_max(self, key: str, x: float) -> None:
        self.values[key] = max(self.values.get(key, -math.inf), x)

    def append(self, key: str, x: float) -> None:
        self.lists.setdefault(key, []).append(x)

    def get(self, key: str) -> float:
        return self.values.get(key, 0.0)

    def ratio(self, num: str, den: str) -> float:
        d = self.get(den)
        return self.get(num) / d if d else 0.0

    def mean(self, key: str) -> float:
        xs = self.lists.get(key, [])
        return sum(xs) / len(xs) if xs else 0.0
