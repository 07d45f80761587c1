"""verl bridge: one harnessrl episode per dataset row, as a verl (0.9.1) agent loop.

Contract: `HarnessrlAgentLoop.run(sampling_params, **row)` runs ONE episode of the row's task
(`extra_info.task_id`, from the configured suite) with the unmodified harness (default
mini-swe-agent) in a sandbox (Docker), through harnessrl's proxy, and scores it with the
hidden tests (`gym.episode.run_episode`: nothing is graded here). The proxy generates through
verl's own `server_manager.generate(request_id=..., prompt_ids=..., sampling_params=...)` on
this loop's event loop (`CallableBackend`); one request id per episode keeps the whole
conversation on one rollout server. Our sampling fields map to verl's: temperature, top_p,
top_k (0 = off is sent as -1), max_new_tokens -> max_tokens, stop_token_ids, seed -> seed
(vllm) / sampling_seed (sglang), logprobs=True always; the engine priority is not sent (verl
orders its own queue). A `TokenOutput` comes back as token ids, logprobs, its stop reason
("aborted" resumes; "completed" at the token budget is "length") and the weight version
`min_global_steps` (else `global_steps`).

The returned `AgentLoopOutput` is the proxy's record, token for token: `prompt_ids` = the
first call's prompt, `response_ids` = everything after it in the segment (sampled tokens and
the tokens the harness/env added between calls), `response_mask` 1 exactly on sampled
tokens, `response_logprobs` the sampler's logprobs (0.0 elsewhere), `reward_score` the
hidden-test reward (verl's reward loop is then skipped), `num_turns` = 2 per model call of
the segment, `extra_fields`: `min_global_steps` / `max_global_steps` (policy versions of the
sampled tokens), `harnessrl_trajectory_id`, `dropped_tokens` (sampled tokens the segment
policy left out), `truncated_tokens` / `truncated_sampled_tokens` (cut at
`rollout.response_length`), `prompt_overflow_tokens` (a first prompt longer than
`rollout.prompt_length` keeps its tail at the head of the response, mask 0, so the sequence
stays exact), status, termination, masked.

Segments (a harness that rewrote its history left several): `segment_policy` "longest"
(most sampled tokens), "last" (the conversation the episode ended in), or "all" (one output
per segment: verl 0.9.1's v1 trainer, `trainer.use_v1=True`, takes a list per sample; the
legacy trainer takes one, so "all" is refused there at construction).

Infra failures (a masked harnessrl episode: sandbox died, engine failed, harness missing,
grader failed; never a 0 in harnessrl) follow `on_infra_error`: "raise" raises
`MaskedEpisode`: verl's v1 trainer marks the group `failure` and trains on its other
members (`trainer.v1.sampler.sync_refill_failed_groups=true` replaces a group left empty),
which keeps the failure out of the GRPO baseline; "mask" returns one output with a single
response token, mask 0 (nothing trained) and reward 0.0 (that 0 does enter the group's
baseline: the legacy trainer, where an exception fails the whole step, has nothing better);
"auto" (default) is "raise" under `trainer.use_v1=True`, else "mask".

Use (verl 0.9.1; rows from `examples/verl/make_dataset.py`; the YAML is
`examples/verl/agent_loop.yaml`):

    python -m verl.trainer.main_ppo trainer.use_v1=True algorithm.adv_estimator=grpo \
      data.train_files=data/harnessrl-builtin.parquet data.val_files=data/harnessrl-builtin.parquet \
      data.train_batch_size=8 data.max_prompt_length=4096 data.max_response_length=16384 \
      actor_rollout_ref.model.path=Qwen/Qwen3-8B \
      actor_rollout_ref.rollout.name=sglang actor_rollout_ref.rollout.n=4 \
      actor_rollout_ref.rollout.calculate_log_probs=True \
      actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loop.yaml \
      actor_rollout_ref.rollout.agent.default_agent_loop=harnessrl
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import replace
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from harnessrl.gym.backends.inprocess import CallableBackend, TokenReply
from harnessrl.gym.episode import EpisodeConfig, EpisodeResult, ProxyHandle
from harnessrl.gym.rollout import RolloutConfig
from harnessrl.gym.stack import EpisodeStack, cancellable
from harnessrl.gym.trajectory import Trajectory
from harnessrl.sandboxes import SandboxName
from harnessrl.trainers.bridges.segments import SegmentRow, segment_rows, select, truncate
from harnessrl.trainers.samples import validate_trajectory

#: Keyword arguments verl itself hands every agent loop (besides AgentLoopBase's own); the
#: YAML entry's other keys are `VerlBridgeConfig` fields.
_VERL_KWARGS = ("name", "tools")


class VerlBridgeConfig(BaseModel):
    """The YAML entry's keys (besides `name` and `_target_`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    suite: str = "builtin"
    """Task suite (name or .jsonl/.parquet file) that rows' `task_id`s come from."""
    harness: str = "mini-swe-agent"
    """Adapter name, "module:Class", or a command-adapter config file; a row may override it."""
    sandbox: SandboxName = "docker"
    """Sandbox backend of the episodes."""
    segment_policy: Literal["longest", "last", "all"] = "longest"
    """Which segment(s) of a rewritten history become outputs (module doc)."""
    on_infra_error: Literal["auto", "raise", "mask"] = "auto"
    """What a masked episode returns (module doc)."""
    max_new_tokens: int = Field(1024, ge=1)
    """Cap on tokens per model call; a row may lower or raise it."""
    served_model_name: str = "policy"
    """The model name harnesses are configured with."""
    engine_timeout_s: float = Field(900.0, gt=0)
    """Longest one generation may take before the call fails (the episode is then masked)."""
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    """Per-episode limits (max_calls, wall_time_s, max_tokens) and reward settings."""
    trajectories_path: str | None = None
    """Append every closed harnessrl trajectory here as a JSON line (None: not kept)."""


class RowSpec(BaseModel):
    """What one dataset row says, read from `extra_info` (or top-level columns of the same name)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1)
    suite: str | None = None
    harness: str | None = None
    max_calls: int | None = Field(None, ge=1)
    wall_time_s: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, ge=1)
    max_new_tokens: int | None = Field(None, ge=1)

    @classmethod
    def of(cls, row: dict[str, Any]) -> "RowSpec":
        info = _plain(row.get("extra_info")) or {}
        if not isinstance(info, dict):
            raise ValueError(f"extra_info: expected a mapping, got {type(info).__name__}")
        fields = {k: row[k] for k in cls.model_fields if k in row}
        fields.update({k: info[k] for k in cls.model_fields if k in info})  # verl's own keys (index...) pass by
        try:
            return cls.model_validate(fields)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"extra_info.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


class MaskedEpisode(RuntimeError):
    """The episode was masked (infrastructure, not the policy); `trajectory` says why."""

    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory
        super().__init__(f"harnessrl episode {trajectory.session_id} (task {trajectory.task_id}) is masked: "
                         f"{trajectory.termination}: {trajectory.metadata.get('error', '')}")


def _plain(value: Any) -> Any:
    """OmegaConf containers and numpy/pyarrow values (parquet rows) as plain Python."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value.tolist() if hasattr(value, "tolist") else value


class _Shared:
    """Per-process, shared by every episode: suites' tasks, adapters, sandbox backends."""

    lock = threading.Lock()
    tasks: dict[str, dict[str, Any]] = {}
    adapters: dict[str, Any] = {}
    sandboxes: dict[str, Any] = {}

    @classmethod
    def task(cls, suite: str, task_id: str) -> Any:
        from harnessrl.gym.tasks.loaders import load_suite

        with cls.lock:
            if suite not in cls.tasks:
                cls.tasks[suite] = {t.instance_id: t for t in load_suite(suite)}
        if task_id not in cls.tasks[suite]:
            raise ValueError(f"extra_info.task_id: {task_id!r} is not in suite {suite!r}")
        return cls.tasks[suite][task_id]

    @classmethod
    def adapter(cls, name: str) -> Any:
        from harnessrl.adapters import get_adapter

        with cls.lock:
            if name not in cls.adapters:
                cls.adapters[name] = get_adapter(name)
            return cls.adapters[name]

    @classmethod
    def sandbox(cls, name: str) -> Any:
        from harnessrl.sandboxes import make_backend

        with cls.lock:
            if name not in cls.sandboxes:
                cls.sandboxes[name] = make_backend(name)
            return cls.sandboxes[name]


def verl_sampling_params(params: dict[str, Any], run_params: dict[str, Any], engine: str) -> dict[str, Any]:
    """verl's sampling_params for one of the proxy's generations (`params`: our contract's
    names); other keys verl's worker set for the run (repetition_penalty...) pass through."""
    ours = ("temperature", "top_p", "top_k", "logprobs", "max_tokens", "max_new_tokens", "seed", "sampling_seed")
    sp = {k: v for k, v in run_params.items() if k not in ours}
    sp.update(temperature=float(params["temperature"]), top_p=float(params["top_p"]), top_k=int(params["top_k"]),
              max_tokens=int(params["max_new_tokens"]), logprobs=True)
    if params.get("stop_token_ids"):
        sp["stop_token_ids"] = [int(t) for t in params["stop_token_ids"]]
    if params.get("seed") is not None:
        sp["seed" if engine == "vllm" else "sampling_seed"] = int(params["seed"])
    return sp


def token_reply(out: Any, max_tokens: int) -> TokenReply:
    """A verl `TokenOutput` as our `TokenReply`."""
    extra = dict(out.extra_fields or {})
    version = extra.get("min_global_steps")
    if version is None:
        version = extra.get("global_steps")
    finish = out.stop_reason
    if finish in (None, "completed") and len(out.token_ids) >= max_tokens:
        finish = "length"
    return TokenReply(list(out.token_ids), None if out.log_probs is None else list(out.log_probs),
                      finish or "completed", version, extra=extra)


def fit_prompt(row: SegmentRow, prompt_length: int) -> tuple[SegmentRow, int]:
    """A prompt longer than `prompt_length` keeps its head; its tail opens the response, mask 0."""
    over = len(row.prompt_ids) - prompt_length
    if over <= 0:
        return row, 0
    tail = row.prompt_ids[prompt_length:]
    return replace(row, prompt_ids=row.prompt_ids[:prompt_length], response_ids=tail + row.response_ids,
                   response_mask=[0] * over + row.response_mask, response_logprobs=[0.0] * over + row.response_logprobs,
                   versions=[-1] * over + row.versions), over


_write_lock = threading.Lock()


@register("harnessrl")
class HarnessrlAgentLoop(AgentLoopBase):
    """One harnessrl episode per sample; see the module doc."""

    def __init__(self, trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **kwargs: Any):
        bridge = {k: _plain(kwargs.pop(k)) for k in list(kwargs) if k not in _VERL_KWARGS and k != "hf_model_type"}
        for k in _VERL_KWARGS:
            kwargs.pop(k, None)
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **kwargs)
        try:
            self.bridge = VerlBridgeConfig.model_validate(bridge)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"harnessrl agent loop config: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        self.v1 = bool(OmegaConf.select(self.config, "trainer.use_v1", default=False))
        if self.bridge.segment_policy == "all" and not self.v1:
            raise ValueError("segment_policy: 'all' needs verl's v1 trainer (trainer.use_v1=True), which takes several "
                             "outputs per sample; the legacy trainer takes one: use 'longest' or 'last'")
        self.on_infra_error = self.bridge.on_infra_error
        if self.on_infra_error == "auto":
            self.on_infra_error = "raise" if self.v1 else "mask"
        self.last_result: EpisodeResult | None = None
        """The last episode this instance ran (its closed trajectory is the proxy's record)."""

    # -- one episode ------------------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        row = RowSpec.of(kwargs)
        task = _Shared.task(row.suite or self.bridge.suite, row.task_id)
        limits = {k: getattr(row, k) for k in ("max_calls", "wall_time_s", "max_tokens") if getattr(row, k) is not None}
        stack = self._stack(sampling_params, row, self.bridge.episode.model_copy(update=limits))
        request_id = uuid.uuid4().hex  # sticky: every call of this episode goes to one server
        proxy = stack.proxy(generation_backend=self._backend(sampling_params, request_id), tokenizer=self.tokenizer)
        await asyncio.to_thread(proxy.start)
        try:
            handle = ProxyHandle.of(proxy)  # no engine URL: verl's servers have no /health here
            meta = {"verl_request_id": request_id, "verl_global_steps": _plain(kwargs.get("global_steps"))}
            result = await cancellable(lambda cancel: stack.run(task, handle, session_meta=meta, cancel=cancel),
                                       "verl cancelled the sample")
        finally:
            await asyncio.to_thread(proxy.stop)
        self.last_result = result
        if self.bridge.trajectories_path:
            with _write_lock, open(self.bridge.trajectories_path, "a") as f:
                f.write(result.trajectory.to_json() + "\n")
        return self.outputs(result.trajectory, kwargs)

    def _stack(self, sampling_params: dict[str, Any], row: RowSpec, episode: EpisodeConfig) -> EpisodeStack:
        """The episode stack of one sample: the process's adapter and sandbox backend, a proxy
        sampling as verl's run asks (`RolloutConfig` of the bridge's settings and the row's)."""
        run_params = _plain(dict(sampling_params))
        harness = row.harness or self.bridge.harness
        cfg = RolloutConfig(
            harness=harness, suite=row.suite or self.bridge.suite, sandbox=self.bridge.sandbox, sandbox_pool_size=0,
            model=str(OmegaConf.select(self.config, "actor_rollout_ref.model.path", default="")),
            served_model_name=self.bridge.served_model_name, sampling_policy="run",
            temperature=float(run_params.get("temperature", 1.0)), top_p=float(run_params.get("top_p", 1.0)),
            top_k=int(run_params.get("top_k", -1) or -1), max_new_tokens=row.max_new_tokens or self.bridge.max_new_tokens,
            engine_timeout_s=self.bridge.engine_timeout_s, episode=episode)
        return EpisodeStack(cfg, adapter=_Shared.adapter(harness), sandbox_backend=_Shared.sandbox(self.bridge.sandbox))

    def _backend(self, sampling_params: dict[str, Any], request_id: str) -> CallableBackend:
        """verl's `server_manager.generate` as the proxy's generation backend, on this loop."""
        engine = str(OmegaConf.select(self.rollout_config, "name", default="sglang"))
        run_params = _plain(dict(sampling_params))

        async def generate(input_ids: list[int], params: dict[str, Any], rid: str) -> TokenReply:
            sp = verl_sampling_params(params, run_params, engine)
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=input_ids, sampling_params=sp)
            return token_reply(out, sp["max_tokens"])

        sampled = engine == "vllm" and OmegaConf.select(self.rollout_config, "logprobs_mode",
                                                        default="processed_logprobs") == "processed_logprobs"
        return CallableBackend(generate, name="verl", loop=asyncio.get_running_loop(),
                               logprob_space="sampled" if sampled else "tempered")

    # -- the record as verl's output ----------------------------------------------------------
    def outputs(self, traj: Trajectory, row: dict[str, Any]) -> AgentLoopOutput | list[AgentLoopOutput]:
        """The closed trajectory as verl output(s) (module doc)."""
        if traj.status == "infra_error" or traj.reward is None:
            if self.on_infra_error == "raise":
                raise MaskedEpisode(traj)
            prompt = traj.call_prompt(traj.calls[0]) if traj.calls else self._render(row)
            empty = SegmentRow(-1, prompt, [], [], [], [], 0)
            return self._output(empty, traj, row, masked=True)
        validate_trajectory(traj)
        rows = segment_rows(traj)
        kept, dropped = select(rows, self.bridge.segment_policy, traj)
        if not kept:  # scored, but the policy sampled nothing: the reward still counts
            kept = [rows[0] if rows else SegmentRow(-1, self._render(row), [], [], [], [], 0)]
        outs = [self._output(r, traj, row, dropped=dropped) for r in kept]
        return outs if self.bridge.segment_policy == "all" else outs[0]

    def _output(self, r: SegmentRow, traj: Trajectory, row: dict[str, Any], *, masked: bool = False,
                dropped: int = 0) -> AgentLoopOutput:
        r, overflow = fit_prompt(r, int(self.rollout_config.prompt_length))
        r, cut, sampled_cut = truncate(r, int(self.rollout_config.response_length))
        if not r.response_ids or masked:  # verl puts the reward on the last response token: keep one
            r = replace(r, response_ids=r.response_ids[:1] or [self._filler()], response_mask=[0],
                        response_logprobs=[0.0], versions=[-1])
        versions = [v for v, m in zip(r.versions, r.response_mask) if m] or \
            [v for s in traj.segments for v, m in zip(s.versions, s.loss_mask) if m] or \
            [int(_plain(row.get("global_steps")) or 0)]
        calls = traj.delivered_calls
        extra = {
            "min_global_steps": min(versions), "max_global_steps": max(versions),
            "harnessrl_trajectory_id": traj.session_id, "harnessrl_task_id": traj.task_id,
            "harnessrl_status": traj.status, "harnessrl_termination": traj.termination, "harnessrl_masked": masked,
            "harnessrl_segment": r.segment, "harnessrl_segments": len(traj.segments), "dropped_tokens": dropped,
            "truncated_tokens": cut, "truncated_sampled_tokens": sampled_cut, "prompt_overflow_tokens": overflow,
            "reward_extra_info": {},
        }
        return AgentLoopOutput(
            prompt_ids=r.prompt_ids, response_ids=r.response_ids, response_mask=r.response_mask,
            response_logprobs=r.response_logprobs, reward_score=0.0 if masked else float(traj.reward),
            num_turns=0 if masked else 2 * r.num_calls,
            metrics=AgentLoopMetrics(generate_sequences=sum(c.gen_s for c in calls),
                                     tool_calls=sum(c.env_s or 0.0 for c in calls)),
            extra_fields=extra)

    def _render(self, row: dict[str, Any]) -> list[int]:
        """The row's own prompt (`raw_prompt`) as ids, for an episode that recorded no call."""
        messages = [dict(m) for m in (_plain(row.get("raw_prompt")) or [])] or [{"role": "user", "content": ""}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))[-int(self.rollout_config.prompt_length):]

    def _filler(self) -> int:
        tok = self.tokenizer
        return int(tok.eos_token_id if tok.eos_token_id is not None else (tok.pad_token_id or 0))
