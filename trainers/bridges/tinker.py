"""The Tinker bridge: harnessrl's loop, Tinker's training and sampling service.

harnessrl keeps owning what it owns with the built-in trainer: episodes, GRPO advantages
(`trainers.samples.build_samples`) and staleness (the scheduler). A Tinker service (hosted
Tinker, or SkyRL's open-source Tinker server) owns the weights: a LoRA training client
takes the update, and each update is published as a new sampling client, which is a new
policy version. The proxy samples through `harnessrl.gym.backends.tinker.TinkerBackend`
(`TinkerTrainer.backend`), which the trainer swaps to the new client after every update.

One `step(batch)`:
1. validate the records and build samples (versions checked against this trainer's);
2. refuse tokens not sampled at temperature 1 without top-p/top-k: Tinker's losses score
   every target at the raw model's distribution, so a recorded logprob from any other
   distribution would give a wrong importance ratio;
3. one `Datum` per sample over the shifted sequence: `model_input = tokens[:-1]`,
   `target_tokens = tokens[1:]`, `logprobs` = the sampler's logprob on sampled targets and 0
   elsewhere, `advantages` = the sample's advantage on sampled targets and 0 elsewhere,
   scaled for the normalization (below);
4. `forward_backward(data, loss_fn)` ("importance_sampling": -sum ratio * A; "ppo": clipped),
   `optim_step(AdamParams(...))`; then the version is bumped, the weights are published with
   `save_weights_and_get_sampling_client()` and swapped into the backend.

Normalization: Tinker's losses sum over target tokens. Both losses are positively
homogeneous in the advantage, so scaling a token's advantage by c scales exactly its term:
"token" divides by the batch's sampled-token count (every trained token counts once, as
the built-in trainer's "token" normalization); "sequence" multiplies by the sample's
trajectory weight over its sampled tokens and the number of trajectories (each trajectory
counts once).

`forward_backward` runs on the pre-update weights, so its per-token logprobs give the
fidelity numbers (|trainer - sampler| on fresh tokens, k3 KL to the sampler) of the update
itself. The weights live on the service: `publish(out_dir)` saves a sampler checkpoint
there and writes its `tinker://` path to `out_dir/tinker.json`; it is not an HF folder.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.gym.backends.tinker import TinkerBackend, resolve_reply
from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.base import StepMetrics
from harnessrl.trainers.samples import RecordError, Sample, SampleConfig, build_samples

#: The one distribution Tinker's losses score targets in: (temperature, top_p, top_k).
RAW = (1.0, 1.0, -1)


class TinkerTrainerConfig(BaseModel):
    """The Tinker bridge. The API key is read by the Tinker SDK from TINKER_API_KEY."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    base_url: str | None = None
    """The Tinker service (e.g. http://127.0.0.1:8000 for a SkyRL Tinker server); None: the
    SDK's default (hosted Tinker, or TINKER_BASE_URL)."""
    model: str = "Qwen/Qwen3-4B-Instruct-2507"
    """Base model as the service names it (a hub id, or the folder a local server loaded)."""
    lora_rank: int = Field(32, ge=1)
    """LoRA rank of the training client."""
    loss_fn: Literal["importance_sampling", "ppo"] = "importance_sampling"
    """Tinker's policy loss: "importance_sampling" (-ratio * A, no clip) or "ppo" (clipped)."""
    clip_low_threshold: float = Field(0.8, gt=0, lt=1)
    """"ppo" only: ratios below this are clipped (Tinker's loss_fn_config)."""
    clip_high_threshold: float = Field(1.2, gt=1)
    """"ppo" only: ratios above this are clipped."""
    normalization: Literal["token", "sequence"] = "token"
    """"token": every sampled token in the batch counts once; "sequence": each trajectory counts once."""
    lr: float = Field(1e-5, gt=0)
    """Adam learning rate (`AdamParams.learning_rate`)."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """Adam beta1."""
    beta2: float = Field(0.95, ge=0, lt=1)
    """Adam beta2."""
    eps: float = Field(1e-12, gt=0)
    """Adam epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    grad_clip_norm: float = Field(0.0, ge=0)
    """Clip the gradient norm to this on the service; 0 disables."""
    seed: int | None = 0
    """Seed of the LoRA initialization (None: the service picks)."""
    samples: SampleConfig = Field(default_factory=SampleConfig)
    """How trajectories become samples: advantages, weights, truncated episodes."""


def _error(s: Sample, i: int, t: tuple[float, float, int]) -> RecordError:
    return RecordError(s.session_id, f"token [{i}] was sampled at temperature {t[0]:g}, top_p {t[1]:g}, top_k {t[2]}; "
                                     "Tinker's losses score tokens at temperature 1 without top-p/top-k, so its "
                                     "logprob has no importance ratio there: sample at temperature 1.0, top_p 1.0, "
                                     "top_k -1 for the Tinker trainer", s.segment, "calls.flags.sampling")


def check_raw_sampling(samples: list[Sample]) -> None:
    """Refuse any sampled token whose recorded distribution is not the raw model's (module doc, 2)."""
    for s in samples:
        for i, m in enumerate(s.loss_mask):
            if not m or not s.temperature:
                continue
            t = (s.temperature[i], s.top_p[i], s.top_k[i])
            if t != RAW:
                raise _error(s, i, t)


def token_scales(samples: list[Sample], mode: str) -> list[float]:
    """Per sample, the factor its advantage is multiplied by (module doc, Normalization)."""
    if mode == "token":
        total = sum(s.n_sampled for s in samples)
        return [1.0 / total] * len(samples)
    n_traj = len({s.session_id for s in samples})
    return [s.weight / s.n_sampled / n_traj for s in samples]


def datum_inputs(s: Sample, scale: float) -> dict[str, list]:
    """The shifted `loss_fn_inputs` of one sample (module doc, 3), as plain lists."""
    toks, mask = s.token_ids, s.loss_mask
    return {"target_tokens": list(toks[1:]),
            "logprobs": [float(s.logprobs[i]) if mask[i] else 0.0 for i in range(1, len(toks))],
            "advantages": [s.advantage * scale if mask[i] else 0.0 for i in range(1, len(toks))]}


def build_datums(samples: list[Sample], normalization: str) -> list[Any]:
    """One Tinker `Datum` per sample: `tokens[:-1]` in, `datum_inputs` as its loss inputs."""
    from tinker import types

    scales = token_scales(samples, normalization)
    return [types.Datum(model_input=types.ModelInput.from_ints(s.token_ids[:-1]), loss_fn_inputs=datum_inputs(s, c))
            for s, c in zip(samples, scales)]


def _loss(fb: Any) -> float:
    """The batch loss: the service's "loss" metric, else the sum of its per-token losses."""
    value = _metric(fb.metrics, "loss")
    if math.isnan(value):
        parts = [o["elementwise_loss"].tolist() for o in fb.loss_fn_outputs if "elementwise_loss" in o]
        value = float(sum(sum(p) for p in parts)) if parts else math.nan
    return value


def _metric(metrics: dict[str, float] | None, *needles: str) -> float:
    for k, v in (metrics or {}).items():
        if any(n in k for n in needles):
            return float(v)
    return math.nan


class TinkerTrainer:
    """A harnessrl `Trainer` whose weights live on a Tinker service; see the module doc."""

    Config = TinkerTrainerConfig
    """The config class, so a composition root can do `cls(cls.Config(**section))`."""

    @classmethod
    def for_run(cls, run: Any) -> "TinkerTrainer":
        """The trainer of a `harnessrl train` run (`TrainConfig`): its `tinker` section (blocking SDK calls)."""
        if run.tinker is None:
            raise ValueError("trainer_name 'tinker' needs a [tinker] section")
        return cls(run.tinker)

    def weight_sync(self) -> "TinkerSync":
        """The main loop's sync step: the service samples itself, so nothing moves (`TinkerSync`)."""
        return TinkerSync()

    def __init__(self, config: TinkerTrainerConfig, *, service_client: Any = None):
        import tinker

        self.config = config
        self.service = service_client or tinker.ServiceClient(base_url=config.base_url)
        tc = self.service.create_lora_training_client(base_model=config.model, rank=config.lora_rank, seed=config.seed)
        self.training_client = tc.result() if callable(getattr(tc, "result", None)) else tc
        self._version = 0
        self._steps = 0
        self._saves = 0
        self.backend = TinkerBackend(self._new_sampler(), version=0)
        """The proxy's generation backend: always the latest published sampling client."""

    @property
    def version(self) -> int:
        return self._version

    def _new_sampler(self) -> Any:
        sc = self.training_client.save_weights_and_get_sampling_client()
        return sc.result() if callable(getattr(sc, "result", None)) else sc

    def step(self, batch: list[Trajectory]) -> StepMetrics:
        from tinker import types

        t0 = time.monotonic()
        sb = build_samples(batch, self.config.samples, current_version=self._version)
        check_raw_sampling(sb.samples)
        tokens = sum(s.n_sampled for s in sb.samples)
        stale = [self._version - v for s in sb.samples for v, m in zip(s.versions, s.loss_mask) if m]
        base = dict(kl=None, behav_filtered_frac=0.0, tokens=tokens, samples=len(sb.samples), trajectories=sb.trajectories,
                    masked_infra=sb.masked_infra, dropped_truncated=sb.dropped_truncated, reward_mean=sb.reward_mean,
                    success_rate=sb.success_rate, lr=self.config.lr, staleness_max=max(stale, default=0),
                    staleness_mean=sum(stale) / len(stale) if stale else 0.0)
        if tokens == 0 or all(s.advantage == 0.0 for s in sb.samples):
            return StepMetrics(step=self._steps, version=self._version, updated=False, loss=0.0, pg_loss=0.0,
                               grad_norm=0.0, kl_behaviour=0.0, clip_frac=0.0, logprob_mismatch_mean=None,
                               logprob_mismatch_max=None, mismatch_tokens=0, step_s=time.monotonic() - t0, **base)
        data = build_datums(sb.samples, self.config.normalization)
        cfg = self.config
        loss_cfg = ({"clip_low_threshold": cfg.clip_low_threshold, "clip_high_threshold": cfg.clip_high_threshold}
                    if cfg.loss_fn == "ppo" else None)
        fb = self._wait(self.training_client.forward_backward(data, loss_fn=cfg.loss_fn, loss_fn_config=loss_cfg))
        fidelity = self._fidelity(sb.samples, [o["logprobs"].tolist() for o in fb.loss_fn_outputs])
        opt = self._wait(self.training_client.optim_step(types.AdamParams(
            learning_rate=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay,
            grad_clip_norm=cfg.grad_clip_norm)))
        self._steps += 1
        self._version += 1
        self.backend.swap(self._new_sampler(), self._version)  # publish: the proxy's next calls sample the update
        loss = _loss(fb)
        return StepMetrics(step=self._steps, version=self._version, updated=True, loss=loss, pg_loss=loss,
                           grad_norm=_metric(getattr(opt, "metrics", None), "grad_norm"),
                           step_s=time.monotonic() - t0, **fidelity, **base)

    def _fidelity(self, samples: list[Sample], logps: list[list[float]]) -> dict[str, Any]:
        """Pre-update trainer logprobs vs the sampler's: mismatch on fresh tokens, k3 KL, clip fraction."""
        diffs, kl, clipped, n = [], 0.0, 0, 0
        lo, hi = self.config.clip_low_threshold, self.config.clip_high_threshold
        for s, lp in zip(samples, logps):
            for i in range(1, len(s.token_ids)):
                if not s.loss_mask[i]:
                    continue
                cur, behav = float(lp[i - 1]), s.logprobs[i]
                n += 1
                d = behav - cur
                kl += math.exp(d) - d - 1.0
                ratio = math.exp(cur - behav)
                if self.config.loss_fn == "ppo" and ((ratio > hi and s.advantage > 0) or (ratio < lo and s.advantage < 0)):
                    clipped += 1
                if s.versions[i] == self._version:
                    diffs.append(abs(cur - behav))
        return dict(kl_behaviour=kl / n if n else 0.0, clip_frac=clipped / n if n else 0.0,
                    logprob_mismatch_mean=sum(diffs) / len(diffs) if diffs else None,
                    logprob_mismatch_max=max(diffs) if diffs else None, mismatch_tokens=len(diffs))

    @staticmethod
    def _wait(reply: Any) -> Any:
        return reply.result() if callable(getattr(reply, "result", None)) else reply

    def _name(self, what: str) -> str:
        """A checkpoint name unique within this model (the service refuses a name twice)."""
        self._saves += 1
        return f"harnessrl-{what}-{self._saves}"

    def publish(self, out_dir: str | Path) -> int:
        """Save a sampler checkpoint on the service; write its path and version to out_dir/tinker.json."""
        resp = self._wait(self.training_client.save_weights_for_sampler(name=self._name(f"v{self._version}")))
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "tinker.json.tmp"
        tmp.write_text(json.dumps({"version": self._version, "path": resp.path, "base_model": self.config.model}))
        tmp.replace(out / "tinker.json")
        return self._version

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        """Save weights and optimizer state on the service; the folder holds its path, step and version."""
        resp = self._wait(self.training_client.save_state(name=self._name(f"step{self._steps}")))
        out = Path(ckpt_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tinker_state.json").write_text(json.dumps({"path": resp.path, "step": self._steps, "version": self._version}))
        return out

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        """Resume from a `save_checkpoint` folder. Tinker loads a state only into a model that has
        had no request yet, so a new training client is made from it (weights and optimizer),
        and its sampler is swapped into the backend."""
        state = json.loads((Path(ckpt_dir) / "tinker_state.json").read_text())
        self.training_client = self._wait(self.service.create_training_client_from_state_with_optimizer(state["path"]))
        self._steps, self._version = int(state["step"]), int(state["version"])
        self.backend.swap(self._new_sampler(), self._version)


class TinkerSync:
    """The main loop's weight-sync step for the Tinker bridge: nothing to move, since `step`
    (and `load_checkpoint`) already swapped the new sampler into the proxy's backend;
    `push` only reports the version. Shaped like `weight_sync.DiskWeightSync`."""

    def __init__(self) -> None:
        self.gate: Any = None
        """Unused: a swap is atomic, so proxy admission needs no pause."""
        self.last_sync_s = 0.0

    async def push(self, trainer: TinkerTrainer) -> int:
        return trainer.version

    async def aclose(self) -> None:
        return None


__all__ = ["TinkerSync", "TinkerTrainer", "TinkerTrainerConfig", "build_datums", "check_raw_sampling", "datum_inputs", "token_scales"]
