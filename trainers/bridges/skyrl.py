"""SkyRL bridge: harnessrl episodes behind SkyRL's `GeneratorInterface` (skyrl 0.3.0).

Contract of `HarnessrlGenerator.generate(input_batch) -> GeneratorOutput`:
- One harnessrl episode per prompt, through `gym.episode.run_episode` (a sandbox, the
  unmodified harness, harnessrl's proxy, the hidden tests after the harness has gone), up to
  `max_concurrency` at once, each in a thread of its own (`gym.stack.cancellable`), on the
  bridge's one `gym.stack.EpisodeStack` (adapter, sandbox backend, a proxy per sampling setting).
- The task is `env_extras[i]["task_id"]` in suite `env_extras[i].get("suite", config.suite)`.
  SkyRL's `prompts[i]` is not sent anywhere: the harness writes its own prompts from the
  task's problem statement (the dataset's prompt column is only SkyRL's bookkeeping).
- Every model call goes through SkyRL's inference engine client on the trainer's own event
  loop (`CallableBackend(fn, loop=...)` handed to `ProxyServer`): one call is
  `client.generate({"prompt_token_ids": [ids], "sampling_params": {...}, "session_ids": [sid]})`
  where `sid` is the episode's proxy session (`gym.backends.protocol.SESSION`), the same for
  all its calls; `client.finish_session(sid)` when the episode is over.
- Sampling: the batch's `sampling_params` (SkyRL's vLLM dict) set the run's temperature,
  top_p, top_k and per-call `max_tokens` (the proxy's "run" sampling policy, recorded with each
  call); one proxy per distinct setting, so training and greedy eval are each recorded as what
  they were. Other vLLM fields (min_p, repetition_penalty, ...) pass through; `stop` strings
  do not (a harness's stop strings are the proxy's to apply); logprobs are always asked for.
- The output (rows, rewards, masks, masked episodes, metrics) is `skyrl_output.build_output`;
  `generator.step_wise_trajectories`, `apply_overlong_filtering` and `zero_reward_on_non_stop`
  are read from SkyRL's generator config.
- Cancelled (SkyRL stops the batch), each running episode's `Cancel` is set (its harness is
  killed, its sandbox closed) before the cancellation goes on.
"""
from __future__ import annotations

import asyncio
import atexit
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from harnessrl.gym.backends.inprocess import CallableBackend, TokenReply
from harnessrl.gym.backends.protocol import SESSION
from harnessrl.gym.backends.engine_client import EngineTimeouts
from harnessrl.gym.episode import EpisodeConfig, ProxyHandle
from harnessrl.gym.rollout import RolloutConfig
from harnessrl.gym.stack import EpisodeStack, cancellable
from harnessrl.sandboxes import SandboxName
from harnessrl.trainers.bridges.skyrl_output import Episode, build_output

_OWNED = ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed", "n", "logprobs")
"""vLLM sampling fields the proxy decides per call; the rest of SkyRL's dict passes through."""


class SkyRLBridgeConfig(BaseModel):
    """What the SkyRL bridge runs, and how its rows are shaped."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    harness: str = "mini-swe-agent"
    """Adapter name (`harnessrl.adapters.REGISTRY`), "module:Class", or a command-adapter config file."""
    harnesses: list[str] | None = None
    """Several harnesses, each as `harness` accepts it: a row picks one by its adapter's name in
    `env_extras.harness` (every sample of a prompt shares its row, so a group runs through one
    harness); a row without it runs `harness`, which must then be among them (default: the
    first). None: `harness` alone, and a row naming another is refused."""
    suite: str = "builtin"
    """Task suite for rows whose env_extras name none (a suite name or a .jsonl/.parquet task file)."""
    sandbox: SandboxName = "auto"
    """Sandbox backend; auto prefers Docker and falls back to bubblewrap."""
    served_model_name: str = "policy"
    """The model name harnesses are configured with and must send."""
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    """Per-episode limits (model calls, tokens, wall time) and reward settings."""
    max_concurrency: int = Field(8, ge=1)
    """Episodes running at once (each holds a sandbox and a harness process)."""
    step_rows: Literal["segment", "call"] = "segment"
    """Step-wise mode: one row per segment, or one per model call (Harbor's shape)."""
    segment_policy: Literal["longest", "last"] = "longest"
    """Not step-wise, several segments (a history rewrite): which one is the episode's row."""
    max_seq_len: int | None = Field(None, ge=2)
    """Cut responses so prompt + response fit (SkyRL's trainer.algorithm.max_seq_len); None: no cut."""
    mask_failed_groups: bool = True
    """A masked episode masks every rollout of its prompt (SkyRL's Harbor convention)."""
    engine_timeout_s: float = Field(900.0, gt=0)
    """The longest one model call may take; past it the call fails and the episode is masked."""
    out_dir: str | None = None
    """Where the proxies keep their stores and sockets; None: a fresh temp dir."""


def engine_fn(client: Any, base: dict[str, Any], policy_model_name: str | None = None):
    """The `CallableBackend` callable over SkyRL's inference engine client (module doc)."""
    extra = {k: v for k, v in (base or {}).items() if k not in _OWNED and v is not None}
    logprobs = (base or {}).get("logprobs")
    kw = {"model": policy_model_name} if policy_model_name is not None else {}

    async def generate(input_ids: list[int], params: dict[str, Any], rid: str) -> TokenReply:
        sp = dict(extra, temperature=params.get("temperature", 1.0), top_p=params.get("top_p", 1.0),
                  top_k=params.get("top_k", -1), max_tokens=params["max_new_tokens"],
                  logprobs=logprobs if logprobs is not None else 0)
        for k in ("stop_token_ids", "seed"):
            if params.get(k) is not None:
                sp[k] = params[k]
        version = getattr(client, "weight_version", None)
        out = await client.generate({"prompts": None, "prompt_token_ids": [list(input_ids)], "sampling_params": sp,
                                     "session_ids": [SESSION.get() or rid], "mm_features": None,
                                     "cache_salt": None}, **kw)
        lps = out.get("response_logprobs")
        return TokenReply(list(out["response_ids"][0]), list(lps[0]) if lps and lps[0] is not None else None,
                          out["stop_reasons"][0], weight_version=version)
    return generate


def _cfg(obj: Any, name: str, default: Any = None) -> Any:
    """A field of SkyRL's config (a dataclass or an OmegaConf DictConfig)."""
    return getattr(obj, name, default) if obj is not None else default


class HarnessrlGenerator(GeneratorInterface):
    """SkyRL generator running harnessrl episodes (see the module doc)."""

    def __init__(self, generator_cfg: Any, tokenizer: Any, inference_engine_client: Any,
                 config: SkyRLBridgeConfig | None = None, policy_model_name: str | None = None,
                 adapter: Any = None):
        """`generator_cfg`: SkyRL's `cfg.generator`; `policy_model_name`: what the client knows the
        policy by (SkyRL's `resolve_policy_model_name(cfg)`); `adapter`: a harness adapter object
        to use instead of `config.harness`."""
        self.generator_cfg, self.tokenizer, self.client = generator_cfg, tokenizer, inference_engine_client
        self.config = config or SkyRLBridgeConfig()
        self.policy_model_name = policy_model_name
        self.step_wise = bool(_cfg(generator_cfg, "step_wise_trajectories", False))
        c = self.config
        names = {"harnesses": c.harnesses} if c.harnesses else {}
        if not c.harnesses or "harness" in c.model_fields_set:
            names["harness"] = c.harness
        self.stack = EpisodeStack(RolloutConfig(
            **names, suite=c.suite, sandbox=c.sandbox, sandbox_pool_size=0, served_model_name=c.served_model_name,
            model=getattr(tokenizer, "name_or_path", "") or "skyrl-policy", sampling_policy="run",
            engine_timeout_s=c.engine_timeout_s, episode=c.episode), adapter=adapter)
        """Adapter and sandbox backend of every episode; each sampling setting's proxy is built by it."""
        self.adapter, self.sandboxes = self.stack.adapter, self.stack.backend
        self.out_dir = Path(self.config.out_dir or tempfile.mkdtemp(prefix="harnessrl-skyrl-"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tasks: dict[str, dict[str, Any]] = {}
        self._proxies: dict[tuple, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.last_episodes: list[Episode] = []
        """The last batch's episodes, records included (for logging and inspection)."""
        atexit.register(self.close)

    # -- pieces -------------------------------------------------------------------------
    def task(self, extras: Any, i: int) -> Any:
        """The task row i names; a bad row is an error naming its field."""
        if not isinstance(extras, dict) or not isinstance(extras.get("task_id"), str):
            raise ValueError(f"env_extras[{i}].task_id: a task id string is required, got {extras!r}")
        suite = extras.get("suite") or self.config.suite
        if not isinstance(suite, str):
            raise ValueError(f"env_extras[{i}].suite: a suite name or task file is required, got {suite!r}")
        if suite not in self._tasks:
            from harnessrl.gym.tasks.loaders import load_suite

            self._tasks[suite] = {t.instance_id: t for t in load_suite(suite)}
        task = self._tasks[suite].get(extras["task_id"])
        if task is None:
            raise ValueError(f"env_extras[{i}].task_id: {extras['task_id']!r} is not in suite {suite!r}")
        return task

    def harness(self, extras: dict[str, Any], i: int) -> str | None:
        """The harness row i names (None: the generator's first); one not among this generator's
        harnesses is an error naming the field."""
        name = extras.get("harness")
        if name is None:
            return None
        if not isinstance(name, str) or name not in self.stack.adapters:
            raise ValueError(f"env_extras[{i}].harness: {name!r} is not one of this generator's harnesses "
                             f"{sorted(self.stack.adapters)} (SkyRLBridgeConfig.harnesses)")
        return name

    def proxy(self, sampling: dict[str, Any] | None) -> Any:
        """The started proxy for this sampling setting, generating on the running loop."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new trainer loop (asyncio.run again): its proxies are new too
            self.close()
            self._loop = loop
        sp = dict(sampling or {})
        max_tokens = int(sp.get("max_tokens") or _cfg(_cfg(self.generator_cfg, "sampling_params"),
                                                      "max_generate_length", 1024))
        key = (float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0)), int(sp.get("top_k", -1)), max_tokens,
               tuple(sorted((k, repr(v)) for k, v in sp.items() if k not in _OWNED)), sp.get("logprobs"))
        if key not in self._proxies:
            n = len(self._proxies)
            version = (lambda: self.client.weight_version) if hasattr(self.client, "weight_version") else None
            backend = CallableBackend(engine_fn(self.client, sp, self.policy_model_name), name="skyrl", loop=loop,
                                      timeouts=EngineTimeouts(None, None, None, self.config.engine_timeout_s),
                                      version=version)
            setting = self.stack.cfg.model_copy(update={"temperature": key[0], "top_p": key[1],
                                                        "top_k": key[2] if key[2] > 0 else -1, "max_new_tokens": max_tokens})
            stack = EpisodeStack(setting, adapter=self.stack.adapter, sandbox_backend=self.stack.backend)
            self._proxies[key] = stack.proxy(generation_backend=backend, tokenizer=self.tokenizer,
                                             db_path=str(self.out_dir / f"trajectories-{n}.db"),
                                             uds_path=str(self.out_dir / f"proxy-{n}.sock")).start()
        return self._proxies[key]

    def close(self) -> None:
        """Stop every proxy (the records stay in `out_dir`)."""
        proxies, self._proxies = list(self._proxies.values()), {}
        for p in proxies:
            p.stop()

    async def _episode(self, proxy: Any, task: Any, harness: str | None, tid: Any, meta: dict[str, Any],
                       gate: asyncio.Semaphore) -> Episode:
        async with gate:
            t0 = time.monotonic()
            handle = ProxyHandle.of(proxy)
            result = await cancellable(lambda cancel: self.stack.run(task, handle, session_meta=meta, cancel=cancel,
                                                                     harness=harness),
                                       "SkyRL cancelled the generation batch")
            finish = getattr(self.client, "finish_session", None)
            if finish is not None:
                try:
                    await finish(result.trajectory.session_id)
                except Exception:  # best effort: routing affinity only
                    pass
            return Episode(tid, result.trajectory, time.monotonic() - t0)

    # -- the interface ----------------------------------------------------------------------
    async def generate(self, input_batch: GeneratorInput, disable_tqdm: bool = True) -> GeneratorOutput:
        from skyrl.train.generators.base import TrajectoryID

        extras = input_batch.get("env_extras")
        n = len(input_batch["prompts"])
        if extras is None or len(extras) != n:
            raise ValueError(f"env_extras: one dict per prompt is required ({n} prompts), got {extras!r:.200}")
        tids = input_batch.get("trajectory_ids") or [TrajectoryID(f"row{i}", 0) for i in range(n)]
        if len(tids) != n:
            raise ValueError(f"trajectory_ids: {len(tids)} for {n} prompts")
        if self.step_wise and input_batch.get("trajectory_ids") is None:
            raise ValueError("trajectory_ids: required with generator.step_wise_trajectories")
        tasks = [self.task(e, i) for i, e in enumerate(extras)]
        harnesses = [self.harness(e, i) for i, e in enumerate(extras)]
        proxy = self.proxy(input_batch.get("sampling_params"))
        meta = input_batch.get("batch_metadata")
        gate = asyncio.Semaphore(self.config.max_concurrency)
        version = getattr(self.client, "weight_version", None)
        base = {"global_step": _cfg(meta, "global_step"), "phase": _cfg(meta, "training_phase"),
                "start_version": version if isinstance(version, int) and version >= 0 else None}
        episodes = await asyncio.gather(*(self._episode(proxy, t, h, tid, dict(base, trajectory_id=tid.to_string()), gate)
                                          for t, h, tid in zip(tasks, harnesses, tids)))
        self.last_episodes = list(episodes)
        c = self.config
        return build_output(list(episodes), step_wise=self.step_wise, step_rows=c.step_rows,
                            segment_policy=c.segment_policy, max_seq_len=c.max_seq_len,
                            mask_failed_groups=c.mask_failed_groups,
                            overlong_filtering=bool(_cfg(self.generator_cfg, "apply_overlong_filtering", False)),
                            zero_reward_on_non_stop=bool(_cfg(self.generator_cfg, "zero_reward_on_non_stop", False)))
