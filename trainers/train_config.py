"""The config of `harnessrl train`: one file (TOML or YAML), every field documented, a bad
field named in the error (`load_config`), printed whole with its docstrings by
`documented_config` (`harnessrl train --print-config`). Validation only: nothing here acts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harnessrl.gym.backends import engine_urls
from harnessrl.gym.canary import CanaryConfig
from harnessrl.gym.episode import EpisodeConfig
from harnessrl.gym.grading.verdict import RewardConfig
from harnessrl.gym.placement import PlacementName
from harnessrl.gym.ray_placement import RayPlacementConfig
from harnessrl.gym.rollout import RolloutConfig
from harnessrl.gym.scheduler import SchedulerConfig
from harnessrl.trainers.base import TrainerName
from harnessrl.trainers.bridges.tinker import TinkerTrainerConfig
from harnessrl.trainers.curriculum import CurriculumConfig
from harnessrl.trainers.dynamic_sampling import SamplingConfig
from harnessrl.trainers.evaluate import EvalConfig
from harnessrl.trainers.live import LiveConfig
from harnessrl.trainers.prepare import PrepareConfig
from harnessrl.trainers.torch_trainer import TorchTrainerConfig


# -- the embedded default: a teacher warm start, then GRPO, on 2 CPU cores -----------------------
# 12 scripted gold-teacher episodes on training tasks spread over the projects (`prepare`), 6 SFT
# steps (each teacher episode once), held-out success (greedy, all 9 tasks), 4 GRPO steps of one
# group of 4 (one more group when a group's rewards are all equal), held-out success again.
# What it measures: whether the policy learns to copy the exact `sed -i` call that a fix-level
# statement shows into a well-formed tool call through the unmodified harness, not whether it can
# debug (docs/learning-run.md, with the measured times and figures).
#: The teacher episodes' file, made by `prepare` on the first run and reused by later ones.
DEFAULT_TEACHER_DATA = "runs/train-data/teacher/trajectories.jsonl"


def _default_rollout() -> RolloutConfig:
    # The shipped fix-level training tasks; a teacher's sed call is 47-107 tokens, its submit 46.
    # Two calls: the edit and the submit (the edit alone already scores). At temperature 1 the
    # warmed 135M model rarely copies a 50-token command intact; at 0.7 it sometimes does. The
    # hidden tests take about a second; 120 s still scores a hang 0.
    return RolloutConfig(suite="fix-train", difficulties=["trivial"], max_new_tokens=128, temperature=0.7,
                         episode=EpisodeConfig(max_calls=2, wall_time_s=300, reward=RewardConfig(test_timeout_s=120)))


def _default_sft() -> "SFTConfig":
    return SFTConfig(data=DEFAULT_TEACHER_DATA, steps=6, batch_size=2, lr=1e-4)  # each teacher episode once


def _default_eval() -> EvalConfig:
    # Every held-out task (9: functions no training task mutates), greedy, before and after RL.
    return EvalConfig(suite="fix-heldout", temperature=0.0, points=["post_sft", "post_rl"], concurrency=4)


#: Sandbox start, session open and close, record fetch: time an episode needs besides the
#: harness's wall time and scoring.
EPISODE_OVERHEAD_S = 120.0


class SFTConfig(BaseModel):
    """The sft stage: supervised steps on teacher trajectories (`harnessrl collect`) before RL."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    data: str | None = None
    """A trajectories.jsonl written by `harnessrl collect` (teacher records only)."""
    steps: int = Field(1, ge=1)
    """SFT steps; each is one optimizer update per `trainer.minibatches` shard of its batch."""
    batch_size: int = Field(0, ge=0)
    """Teacher trajectories per step, taken in passes over the file (`shuffle`); 0: the whole file every step."""
    shuffle: bool = True
    """Each pass over the teacher file in a fresh order drawn from the trainer's seed
    (`trainer.seed`; `trainers.sft.sft_batches`), so runs of different seeds are independent
    from SFT on; False: file order (every seed shares the SFT stage)."""
    lr: float | None = Field(None, gt=0)
    """Learning rate of the SFT updates (None: `trainer.lr`)."""
    min_reward: float | None = 1.0
    """Refuse teacher records scored below this (None: any scored record)."""


class TrainConfig(BaseModel):
    """The main job. Every section has its own documented config."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = "smollm2-135m"
    """Prepared model name or folder; the engine, the proxy's tokenizer and the trainer all use it."""
    steps: int = Field(4, ge=1)
    """Training steps (each: one batch of complete groups, one update, one weight sync)."""
    out_dir: str = "runs/train"
    """Run folder: metrics.jsonl, TensorBoard events, trajectories, weights, checkpoints, plots."""
    engine_url: str | list[str] | None = None
    """An SGLang-contract engine to use (e.g. a real SGLang server, or SGLang's router); None starts
    the local CPU engine. A list of several engines serving the same model: each episode sticks to
    one, weight syncs and pauses reach all of them at once, and a failed one is routed around
    (docs/scaling.md, "Many engines")."""
    engine_threads: int | None = Field(2, ge=1)
    """torch threads of the local engine (None: torch's default)."""
    rollout: RolloutConfig = Field(default_factory=_default_rollout)
    """Harness, suite, sandboxes, per-episode limits (its `model` is overridden by `model`)."""
    scheduler: SchedulerConfig = Field(default_factory=lambda: SchedulerConfig(
        env_pool_size=4, group_size=4, groups_per_step=1, staleness=1, episode_timeout_s=1200))
    """Env pool size, GRPO group size G, groups per step, staleness η and its policy."""
    placement: PlacementName = "local"
    """Where episodes run (`gym.placement.PLACEMENTS`): "local" (threads of this process, the
    run's proxy on loopback) or "ray" (Ray actors spread over a cluster's nodes by resources,
    each with its own sandboxes and warm pool, reaching the run's proxy by URL: section `ray`)."""
    ray: RayPlacementConfig = Field(default_factory=RayPlacementConfig)
    """The cluster, the episode workers and their resources, for `placement = "ray"`."""
    trainer_name: TrainerName | None = None
    """Which trainer trains: a name in `trainers.base.TRAINERS` ("torch": the built-in one, its
    section `trainer`; "tinker": the Tinker bridge, its section `tinker`) or a "module:Class" path.
    None: "tinker" when a `tinker` section is given, else "torch"."""
    trainer: TorchTrainerConfig = Field(default_factory=lambda: TorchTrainerConfig(
        lr=1e-4, micro_batch_tokens=4096, trainable_layers=10))
    """The built-in torch trainer (its `model` is overridden by `model`)."""
    tinker: TinkerTrainerConfig | None = None
    """The Tinker bridge instead of the built-in trainer: a Tinker service (hosted, or SkyRL's
    Tinker server) trains a LoRA of `tinker.model` and samples every call through the proxy;
    `trainer`, `engine_url` and `engine_threads` are then unused, and `model` only names the
    proxy's tokenizer (it must be the tokenizer of `tinker.model`)."""
    resume_from: str | None = None
    """A checkpoint folder of an earlier run (e.g. runs/train/checkpoints/last): the trainer's
    weights, optimizer, step and RNG are restored and pushed to the engine before any rollout,
    so the run goes on at that checkpoint's policy version. `steps` more steps are taken."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a resumable checkpoint every N steps (0: only at the end)."""
    tensorboard: bool = True
    """Also write TensorBoard event files to out_dir/tb."""
    stages: list[Literal["sft", "rl"]] = Field(default_factory=lambda: ["sft", "rl"])
    """What the run does, in order: ["sft", "rl"] (default: SFT on `sft.data`, a checkpoint in
    checkpoints/sft, the weights pushed to the engine, then RL from them), ["rl"] or ["sft"].
    With `resume_from` the sft stage runs again on the restored weights."""
    sft: SFTConfig = Field(default_factory=_default_sft)
    """The sft stage (used when `stages` holds "sft")."""
    eval: EvalConfig = Field(default_factory=_default_eval)
    """Held-out evaluation (`trainers.evaluate`): the same held-out tasks at each of `eval.points`
    (before SFT, after SFT, after RL), real episodes at the current weights, never trained on."""
    prepare: PrepareConfig = Field(default_factory=lambda: PrepareConfig(teacher_episodes=12, teacher_spread=True,
                                                                         teacher_concurrency=4))
    """Data the run makes first when it is missing (`trainers.prepare`): synthesized tasks and
    scripted-teacher trajectories for the sft stage."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(zero_variance="refill", max_refills=1))
    """Dynamic sampling (`trainers.dynamic_sampling`): groups whose rewards are all equal carry no
    GRPO signal; `drop` leaves them out and a step with none left trains nothing, `refill` (the
    default run's: one more group at most) takes more groups, `keep` trains on them. Reported
    per step as `zero_var_frac`."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Which training task the scheduler starts next (`trainers.curriculum`): by default tasks
    the policy sometimes solves are favoured; per-task pass rates go to report.json."""
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    """Canary tasks (`gym.canary`): a share of the RL groups from tasks whose hidden tests
    contradict their statement, never rewarded; their pass rate is the measured propensity to
    cheat (per step `canary_pass_rate`, report.json "cheat"). Off by default."""
    live: LiveConfig | None = None
    """Live sessions (`harnessrl serve`, rewarded by `harnessrl feedback`) trained beside the
    sandboxed tasks (`trainers.live`): the store folder, sessions per step and in all, their
    weight, the feedback's minimum age, the baseline of their advantage. None: none."""
    progress: bool = True
    """Show a progress bar."""

    @field_validator("engine_url")
    @classmethod
    def _engine_urls(cls, v: str | list[str] | None) -> str | list[str] | None:
        return None if v is None else engine_urls(v)

    @model_validator(mode="after")
    def _trainer_named(self) -> "TrainConfig":
        """The trainer named (a `tinker` section alone names the Tinker bridge, as it always has),
        and its section present."""
        if self.trainer_name is None:
            self.trainer_name = "tinker" if self.tinker is not None else "torch"
        if (self.trainer_name == "tinker") != (self.tinker is not None):
            raise ValueError(f"trainer_name: {self.trainer_name!r} with{'out' if self.tinker is None else ''} a "
                             "tinker section: the tinker trainer is configured by [tinker], and only it reads it")
        return self

    @model_validator(mode="after")
    def _trainable_sampling(self) -> "TrainConfig":
        r = self.rollout
        if r.temperature == 0 or r.top_k == 1:  # under "honor" a greedy harness is refused at its first step
            name = "rollout.temperature: 0" if r.temperature == 0 else "rollout.top_k: 1"
            raise ValueError(f"{name} is greedy sampling, a point mass with no importance ratio: the trainer "
                             "would refuse every episode; train at a temperature > 0 with top_k -1 or >= 2")
        return self

    @model_validator(mode="after")
    def _stages(self) -> "TrainConfig":
        st = self.stages
        if not st or len(set(st)) != len(st) or st not in (["rl"], ["sft"], ["sft", "rl"]):
            raise ValueError(f"stages: {st} is not one of ['rl'], ['sft'], ['sft', 'rl']")
        if "sft" in st and self.sft.data is None:
            raise ValueError("sft.data: the sft stage needs a teacher trajectories.jsonl (`harnessrl collect`)")
        if "sft" in st and self.tinker is not None:
            raise ValueError("stages: the sft stage runs on the built-in trainer; the tinker bridge has no SFT step")
        return self

    @model_validator(mode="after")
    def _live_in_rl(self) -> "TrainConfig":
        if self.live is not None and ("rl" not in self.stages or self.tinker is not None):
            raise ValueError("live: live sessions train in the rl stage of the built-in trainer "
                             f"(stages {self.stages}{', tinker' if self.tinker is not None else ''})")
        return self

    @model_validator(mode="after")
    def _eval_points(self) -> "TrainConfig":
        ev = self.eval
        if not ev.enabled:
            return self
        reach = {"pre_sft": True, "post_sft": "sft" in self.stages, "post_rl": "rl" in self.stages}
        points = ev.points_for(self.stages)
        bad = [p for p in points if not reach[p]]
        if bad or (ev.points and len(set(ev.points)) != len(ev.points)):
            raise ValueError(f"eval.points: {points}: stages {self.stages} do not reach {bad or 'a repeated point'} "
                             "(eval.points = [] evaluates nowhere)")
        if ev.suite == self.rollout.suite:
            raise ValueError(f"eval.suite: {ev.suite!r} is also rollout.suite: held-out tasks must not be RL tasks")
        return self

    @model_validator(mode="after")
    def _prepared_paths(self) -> "TrainConfig":
        p = self.prepare
        if p.teacher_episodes and (self.sft.data is None or Path(self.sft.data).name != "trajectories.jsonl"):
            raise ValueError(f"sft.data: {self.sft.data!r}: with prepare.teacher_episodes it must be a path ending "
                             "in trajectories.jsonl (`harnessrl collect` writes that file in its folder)")
        if p.tasks_dir is not None:
            folder = Path(p.tasks_dir)
            for name, path, want in (("rollout.suite", self.rollout.suite, "train.jsonl"),
                                     ("eval.suite", self.eval.suite, "heldout.jsonl")):
                if name == "eval.suite" and path is None:
                    continue
                if Path(path) != folder / want:
                    raise ValueError(f"{name}: {path!r}: with prepare.tasks_dir it must be {str(folder / want)!r}")
        return self

    @model_validator(mode="after")
    def _proxies_here(self) -> "TrainConfig":
        """Extra proxy processes (`rollout.proxies`) serve local episodes in front of engine URLs."""
        if self.rollout.proxies > 1 and (self.placement != "local" or self.tinker is not None):
            raise ValueError(f"rollout.proxies: {self.rollout.proxies} proxies serve episodes of placement "
                             f"\"local\" generating on engine URLs; this run has placement {self.placement!r}"
                             f"{' and samples on Tinker' if self.tinker is not None else ''} (use proxies = 1)")
        return self

    @model_validator(mode="after")
    def _tinker_raw_sampling(self) -> "TrainConfig":
        r = self.rollout
        if self.tinker is not None and (r.temperature, r.top_p, r.top_k) != (1.0, 1.0, -1):
            raise ValueError(f"rollout.temperature/top_p/top_k: {r.temperature:g}/{r.top_p:g}/{r.top_k} with tinker: "
                             "Tinker's losses score tokens at temperature 1 without top-p/top-k; use 1.0/1.0/-1")
        return self

    @model_validator(mode="after")
    def _backstop_after_scoring(self) -> "TrainConfig":
        """The scheduler's episode timeout masks what it cuts off, so it must never fire while
        the harness may still run or the grader may still score: otherwise a policy whose code
        hangs the hidden tests would turn its 0 into a mask."""
        ep = self.rollout.episode
        need = ep.wall_time_s + ep.reward.worst_case_s() + EPISODE_OVERHEAD_S
        if self.scheduler.episode_timeout_s < need:
            raise ValueError(
                f"scheduler.episode_timeout_s: {self.scheduler.episode_timeout_s:g} s would cut off episodes that are "
                f"still running or being scored and mask them: it must be at least {need:g} s (rollout.episode."
                f"wall_time_s {ep.wall_time_s:g} + scoring's worst case {ep.reward.worst_case_s():g} (2 x "
                f"reward.test_timeout_s + 6 x reward.command_timeout_s [+ 2 x reward.judge.timeout_s]) + {EPISODE_OVERHEAD_S:g} s of overhead)")
        return self


class ConfigError(ValueError):
    """A bad config file; the message names the field."""


def load_config(path: str | Path | None) -> TrainConfig:
    """TOML (.toml) or YAML (.yaml/.yml); None gives the embedded default."""
    if path is None:
        return TrainConfig()
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"{p}: use a .toml or .yaml file")
    except (ValueError, ImportError) as e:  # tomllib.TOMLDecodeError / yaml.YAMLError are ValueErrors
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{p}: not valid {p.suffix[1:].upper()}: {e}") from e
    except Exception as e:  # yaml.YAMLError is not a ValueError
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{p}: bad config field(s):\n  " + "\n  ".join(lines)) from None


# -- the documented config file ----------------------------------------------------------------
def documented_config(cfg: BaseModel | None = None) -> str:
    """The config as TOML, every field with its docstring as a comment (`harnessrl train --print-config`)."""
    cfg = cfg or TrainConfig()
    lines: list[str] = ["# harnessrl train config: every field, its default and what it means.", ""]
    _emit(cfg, [], lines)
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if v is None:
        raise ValueError("TOML has no null: leave the field out instead")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def _emit(model: BaseModel, path: list[str], lines: list[str]) -> None:
    nested = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        doc = (field.description or "").strip()
        if isinstance(value, BaseModel):
            nested.append((name, value, doc))
            continue
        for d in doc.splitlines():
            lines.append(f"# {d.strip()}")
        if value is None:
            lines.append(f"# {name} =   (unset: None)")
        else:
            lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    for name, value, doc in nested:
        lines.append(f"[{'.'.join(path + [name])}]")
        for d in doc.splitlines():
            lines.append(f"# {d.strip()}")
        lines.append("")
        _emit(value, path + [name], lines)
