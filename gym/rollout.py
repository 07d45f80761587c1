"""Rollouts: many episodes of a run's harnesses on a suite, through the run's proxies, with a report.

Contract: `Rollout` owns the run's proxies (`gym.proxies`) in front of an engine it is handed by URL, a sandbox
backend and a harness adapter, built by the one stack builder (`gym.stack.EpisodeStack`);
`episode(task, slot)` runs one episode in a worker thread
(sandboxes and harnesses block) and returns its closed trajectory. `report(...)` turns
trajectories into the figures every run prints: success rate, reward distribution,
per-turn env latency p50/p95/p99, model-call latency p50/p95, sandbox acquisition and reset
p50/p95, calls and segments per episode with split reasons, failures by reason, the cheat
rate (`gym.cheat`; canary episodes stay out of the success rate). With
`sandbox_pool_size` > 0 episodes lease warm sandboxes (gym.sandbox_source.PooledSandboxes). The engine is never started here: the
composition root (the CLI) starts it, so this layer stays free of torch.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.adapters import HarnessName
from harnessrl.adapters.cancel import Cancel
from harnessrl.adapters.toolchain import HarnessNotInstalled
from harnessrl.gym.backends import BackendName
from harnessrl.gym.cheat import cheat_counts
from harnessrl.gym.episode import EpisodeConfig, ProxyHandle
from harnessrl.gym.harness_mix import HarnessMix, check_weights
from harnessrl.gym.stack import EpisodeStack, cancellable
from harnessrl.gym.trajectory import Trajectory
from harnessrl.sandboxes import SandboxName
from harnessrl.sandboxes.docker_config import DockerConfig


class RolloutConfig(BaseModel):
    """What to roll out, where, and how."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    harness: HarnessName = "mini-swe-agent"
    """Adapter name (`harnessrl.adapters.REGISTRY`), "module:Class", or a command-adapter config file.
    With `harnesses` set it is the run's first harness (one-harness tools, e.g. `prepare`'s teacher, use it)."""
    harnesses: dict[HarnessName, Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None
    """Several harnesses in one run: harness -> weight (a list: equal weights), each name as
    `harness` accepts it. Each GRPO group runs through one harness, drawn by weight with `seed`
    (`gym.harness_mix`), so a group's advantage compares like with like; figures are reported
    per harness and evaluation runs every held-out task through each. None: `harness` alone."""
    seed: int = 0
    """Seeds the draw of each group's harness among `harnesses`: the same seed and weights give
    the same harness for the k-th group of every run."""
    context_length: int | None = Field(None, ge=1)
    """The context of the serving engine in tokens (None: the model's max_position_embeddings).
    `harnessrl train` runs one probe episode per harness first and refuses, naming it, a
    harness whose first prompt (its system prompt, tools and the longest task statement,
    rendered by the model's chat template) does not fit."""
    suite: str = "builtin"
    """Task suite name or a .jsonl/.parquet task file."""
    source_root: str | None = None
    """Folder holding the repositories a task file's rows name but do not ship (SWE-bench
    style): `owner__name`, `name` or `name.bundle` (a checkout, a git bundle or a .tar.gz);
    None: every task must carry its own `source`."""
    tasks: list[str] | None = None
    """Only these instance ids (None: the whole suite)."""
    difficulties: list[str] | None = None
    """Only tasks of these difficulties ("trivial", "easy", "medium", "hard"; None: all)."""
    model: str = "smollm2-135m"
    """Prepared model name or folder: its tokenizer and chat template render prompts."""
    served_model_name: str = "policy"
    """The model name harnesses are configured with and must send."""
    sandbox: SandboxName = "auto"
    """Sandbox backend; auto prefers Docker and falls back to bubblewrap."""
    docker: DockerConfig | None = None
    """The Docker backend's settings (limits, and `engine`: a remote Docker engine, e.g.
    "ssh://user@host"; see docs/setup.md); None: its defaults, on $DOCKER_HOST or this machine's."""
    sandbox_pool_size: int = Field(2, ge=0)
    """Warm sandboxes kept per (repository, harness) pair, leased by episodes and reset
    (processes killed; tree, untracked files, /tmp, home back to base) between them, so an
    episode starts on a clean sandbox without waiting for a new one; 0: a fresh sandbox per
    episode. Set it to the episodes that run at once on one repository (the GRPO group)."""
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    """Per-episode limits (model calls, tokens, wall time) and reward settings."""
    sampling_policy: Literal["run", "honor"] = "run"
    """"run": every model call samples at `temperature` / `top_p` / `top_k` below, whatever the
    harness sends; "honor": the harness's values win where it sends valid ones (ProxyConfig)."""
    temperature: float = Field(1.0, ge=0)
    """The run's sampling temperature (0 = greedy: recorded, but no trainer trains on it)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """The run's nucleus (top-p) mass; 1.0 is off."""
    top_k: int = Field(-1, ge=-1)
    """The run's top-k; -1 is off."""
    max_new_tokens: int = Field(512, ge=1)
    """Cap on tokens generated per model call."""
    backend: BackendName = "sglang"
    """How the proxy reaches the engine (ProxyConfig.backend): "sglang" (SGLang's /generate; the
    local engine speaks it), "vllm" (a vLLM server's token routes; the local engine serves them
    too), or a "module:Class" path. Weight sync still uses SGLang's control routes."""
    vllm_route: Literal["generate", "completions"] = "generate"
    """With backend "vllm": `/inference/v1/generate`, or `/v1/completions` with a token-id prompt."""
    proxies: int = Field(1, ge=1, le=64)
    """Proxies serving the run: this process's and `proxies - 1` processes (`gym.proxies`), each with
    its own store, listed in `stores.json` (`view` and `export` read them as one run)."""
    engine_timeout_s: float = Field(900.0, gt=0)
    """The longest one engine call may take (the proxy's `engine_total_timeout_s`; its first
    token must also come within min(this, 300 s)). Past it the call fails and is recorded, and
    the episode is masked as an engine failure: keep it well above the slowest legitimate reply
    (`max_new_tokens` at the engine's speed under load)."""

    harness_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Keyword arguments of a harness's adapter, by the name `harness` or `harnesses` gives it;
    an option the adapter does not take is refused, listing those it does. For example
    `{opencode = {context = 8192, output = 400}}` (the window OpenCode is told, which sets
    where it compacts its own conversation) or `{codex = {auto_compact_tokens = 7400}}`
    (Codex's `model_auto_compact_token_limit`)."""

    @field_validator("harnesses", mode="before")
    @classmethod
    def _harness_list(cls, hs: Any) -> Any:
        """A list of harnesses is each at weight 1.0, none named twice."""
        if isinstance(hs, (list, tuple)):
            twice = sorted({h for h in hs if hs.count(h) > 1})
            if twice:
                raise ValueError(f"{twice} named twice; give each harness once (a mapping name -> weight weights them)")
            return {h: 1.0 for h in hs}
        return hs

    @model_validator(mode="after")
    def _harness_weights(self) -> "RolloutConfig":
        """At least one harness in `harnesses`; `harness` its first unless set to one of them."""
        if self.harnesses is None:
            return self
        check_weights(self.harnesses)
        if "harness" in self.model_fields_set and self.harness not in self.harnesses:
            raise ValueError(f"rollout.harness: {self.harness!r} is not among rollout.harnesses "
                             f"{list(self.harnesses)}; set only harnesses for a mixed run")
        if "harness" not in self.model_fields_set:
            self.harness = next(iter(self.harnesses))
        return self

    @model_validator(mode="after")
    def _harness_options(self) -> "RolloutConfig":
        """Options only for this run's harnesses, each one its adapter takes."""
        from harnessrl.adapters import check_options

        for name, options in self.harness_options.items():
            if name not in self.harness_weights:
                raise ValueError(f"rollout.harness_options: {name!r} is not one of this run's harnesses "
                                 f"{list(self.harness_weights)}")
            try:
                check_options(name, options)
            except ValueError as e:
                raise ValueError(f"rollout.harness_options.{e}") from None
        return self

    @property
    def harness_weights(self) -> dict[str, float]:
        """Every harness of the run and its weight (one harness: `harness`, weight 1)."""
        return dict(self.harnesses) if self.harnesses else {self.harness: 1.0}


def prewarmed_sandboxes(cfg: RolloutConfig, task_ids: Any, tasks: list | None = None) -> Any:
    """The warm pool of a rollout of `cfg`, made before it (hand it to `Rollout(sandboxes=)`):
    the sandboxes of these tasks' repositories start in the background now, e.g. while the
    engine loads. `tasks`: the run's tasks, loaded once (None: the suite of `cfg`). None when
    `sandbox_pool_size` is 0. The rollout closes it; a pool that never reaches one is closed
    when the process exits. Each task's sandbox is for the harness its group will draw (the
    first draws of `HarnessMix` with the run's seed, as the run makes them)."""
    if not cfg.sandbox_pool_size:
        return None
    import atexit

    stack = EpisodeStack(cfg, tasks=tasks)
    atexit.register(stack.sandboxes.close)
    task_ids = list(task_ids)
    stack.prewarm(task_ids, HarnessMix(stack.harness_weights, cfg.seed).peek(len(task_ids)))
    return stack.sandboxes


class Rollout:
    """A proxy + sandbox backend + adapter (`gym.stack.EpisodeStack`), ready to run episodes
    against one engine. `sandboxes`: a warm pool made ahead (`prewarmed_sandboxes`), used and
    closed by this rollout; None: its own when `sandbox_pool_size` > 0. `tasks`: the run's
    tasks, loaded once by the caller (None: the suite of `cfg`, loaded now)."""

    def __init__(self, cfg: RolloutConfig, engine_url: str | list[str], out_dir: str | Path, generation_backend: Any = None,
                 sandboxes: Any = None, tasks: list | None = None, proxy_fields: dict[str, Any] | None = None):
        """`generation_backend`: a `GenerationBackend` object the proxy generates through
        instead of `engine_url` (e.g. the Tinker bridge's `TinkerBackend`); `proxy_fields`:
        `ProxyConfig` fields the run's settings do not carry (a teacher's, `gym.tools.collect`)."""
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.stack = EpisodeStack(cfg, tasks=tasks, sandboxes=sandboxes)
        self.tasks = self.stack.tasks
        self.adapter, self.backend, self.sandboxes = self.stack.adapter, self.stack.backend, self.stack.sandboxes
        self.proxy = self.stack.proxy(engine_url, self.out_dir, generation_backend, **(proxy_fields or {}))
        from harnessrl.gym.proxies import ProxyFleet

        self.proxies = ProxyFleet(self.proxy, cfg.proxies - 1, self.out_dir)  # `proxy` first; one per episode
        self.results: list[Any] = []
        self.release_wait_s = 120.0
        """How long a cancelled `episode` waits for its thread to release everything."""
        self._file = None

    def __enter__(self) -> "Rollout":
        self.proxies.start()
        for adapter in self.stack.adapters.values():
            warm = getattr(adapter, "warm", None)  # e.g. a beside harness's fork server
            if warm is not None:
                try:
                    warm()
                except HarnessNotInstalled:
                    pass  # each episode records that, with the command that installs it
        self._file = open(self.out_dir / "trajectories.jsonl", "a")
        return self

    def __exit__(self, *exc) -> None:
        if self._file:
            self._file.close()
        self.stack.close()
        self.proxies.stop()

    def prewarm(self, task_ids, harnesses=None) -> None:
        """Start the pool's sandboxes for these tasks' repositories in the background (each for
        the harness beside it in `harnesses`; None: the run's first)."""
        self.stack.prewarm(task_ids, harnesses)

    @property
    def handle(self) -> ProxyHandle:
        return ProxyHandle.of(self.proxy)

    def run_one(self, task_id: str, session_meta: dict[str, Any] | None = None,
                cancel: Cancel | None = None, harness: str | None = None) -> Trajectory:
        """One episode through `harness` (None: the run's first), blocking; the trajectory is
        appended to trajectories.jsonl."""
        with self.proxies.lease() as handle:  # one proxy for the episode's whole life
            result = self.stack.run(task_id, handle, session_meta=session_meta, cancel=cancel, harness=harness)
        self.results.append(result)
        traj = result.trajectory
        assert self._file is not None
        self._file.write(traj.to_json() + "\n")
        self._file.flush()
        return traj

    def set_policy_version(self, version: int) -> None:
        """Tell the proxy the trainer's current version (its per-turn staleness check uses it);
        a run publishes through `gym.stack.Publisher`, which calls this in its order."""
        self.proxies.set_policy_version(version)

    async def episode(self, slot: Any) -> Trajectory:
        """An episode function for `RolloutScheduler` (the slot names the task, and the harness of
        its group: `slot.harness`, None: the run's first). Under the `requeue` policy the proxy
        runs the per-turn staleness check; an episode it aborted raises `StaleEpisode`, so the
        scheduler reruns the task. Cancelled (the scheduler's
        episode timeout, or its close), it kills the harness's process tree, closes the
        sandbox and waits (up to `release_wait_s`) for the episode thread to end before it
        lets the cancellation through: an abandoned episode holds nothing afterwards."""
        from harnessrl.gym.scheduler import raise_if_aborted_stale, session_meta

        start, limit = getattr(slot, "start_version", 0), getattr(slot, "staleness_limit", None)
        traj = await self.run_cancellable(slot.task_id, session_meta(start, limit, getattr(slot, "group_id", None)),
                                          getattr(slot, "harness", None))
        traj.metadata["start_version"] = start
        return raise_if_aborted_stale(traj, limit)

    async def run_cancellable(self, task_id: str, session_meta: dict[str, Any] | None = None,
                              harness: str | None = None) -> Trajectory:
        """`run_one` in a thread of its own; cancelled, it sets the episode's `Cancel` (harness
        tree killed, sandbox closed) and waits up to `release_wait_s` for the thread to end."""
        return await cancellable(lambda cancel: self.run_one(task_id, session_meta, cancel, harness),
                                 "the episode was cancelled (timeout or shutdown)", self.release_wait_s)


# -- the report -------------------------------------------------------------------------------
def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 4)


def report(trajectories: list[Trajectory], wall_s: float | None = None) -> dict[str, Any]:
    scored = [t for t in trajectories if t.reward is not None and t.status != "infra_error"
              and not t.metadata.get("canary")]  # a canary's 0.0 is no failure (gym.canary)
    env = [c.env_s for t in trajectories for c in t.calls if c.env_s is not None]
    call = [c.queue_s + c.gen_s for t in trajectories for c in t.calls]
    tokens = sum(len(c.completion_ids) for t in trajectories for c in t.calls)
    acquire, reset = sandbox_timings(trajectories)
    out: dict[str, Any] = {
        "episodes": len(trajectories),
        "scored": len(scored),
        "success_rate": (sum(t.reward >= 1.0 for t in scored) / len(scored)) if scored else None,
        "reward_distribution": dict(sorted(Counter(str(t.reward) for t in trajectories).items())),
        "env_latency_s": {"p50": percentile(env, .5), "p95": percentile(env, .95), "p99": percentile(env, .99), "n": len(env)},
        "model_call_latency_s": {"p50": percentile(call, .5), "p95": percentile(call, .95), "n": len(call)},
        "sandbox_acquire_s": {"p50": percentile(acquire, .5), "p95": percentile(acquire, .95), "n": len(acquire)},
        "sandbox_reset_s": {"p50": percentile(reset, .5), "p95": percentile(reset, .95), "n": len(reset)},
        "calls_per_episode": _mean([len(t.calls) for t in trajectories]),
        "segments_per_episode": _mean([len(t.segments) for t in trajectories]),
        "split_reasons": dict(Counter(s.split_reason for t in trajectories for s in t.segments if s.split_reason)),
        "endings": dict(Counter(t.termination for t in trajectories)),
        "failures_by_reason": dict(Counter(t.termination for t in trajectories if t.status == "infra_error")),
        "failures": failures(trajectories),
        "completion_tokens": tokens,
        "cheat": cheat_counts(trajectories),
    }
    out["generator_utilization"] = generator_utilization(trajectories)
    if wall_s:
        out["wall_s"] = round(wall_s, 2)
        out["tokens_per_s"] = round(tokens / wall_s, 2)
        out["episodes_per_hour"] = round(len(trajectories) * 3600 / wall_s, 1)
    return out


def failures(trajectories: list[Trajectory], limit: int = 20, chars: int = 1500) -> list[dict[str, Any]]:
    """The first `limit` episodes that failed (infra_error) or whose harness exited non-zero,
    each with why (`ending`), the harness's exit code and the end of its stderr and stdout."""
    out = []
    for t in trajectories:
        m = t.metadata
        code = m.get("harness_exit_code")
        if t.status != "infra_error" and code in (0, None):
            continue
        out.append({"task_id": t.task_id, "termination": t.termination, "status": t.status,
                    "ending": m.get("ending") or m.get("error", ""), "exit_code": code,
                    "stderr_tail": (m.get("harness_stderr_tail") or "")[-chars:],
                    "stdout_tail": (m.get("harness_stdout_tail") or "")[-chars:]})
        if len(out) == limit:
            break
    return out


def sandbox_timings(trajectories: list[Trajectory]) -> tuple[list[float], list[float]]:
    """Per episode: seconds to get its sandbox (any wait included), seconds its pool reset took."""
    timings = [t.metadata.get("timings") or {} for t in trajectories]
    return ([x["sandbox_s"] for x in timings if "sandbox_s" in x],
            [x["sandbox_reset_s"] for x in timings if "sandbox_reset_s" in x])


def generator_utilization(trajectories: list[Trajectory]) -> float | None:
    """Fraction of the run's window (first generation start to last end) in which at least one
    generation was running: the union of every call's [finished_at - gen_s, finished_at]."""
    return busy_fraction(generation_spans(trajectories))


def generation_spans(trajectories: list[Trajectory]) -> list[tuple[float, float]]:
    return [(c.finished_at - c.gen_s, c.finished_at) for t in trajectories for c in t.calls if c.finished_at]


def busy_fraction(spans: list[tuple[float, float]]) -> float | None:
    """The union of the spans over the window from the first start to the last end."""
    spans = sorted(spans)
    if not spans:
        return None
    busy, (cur_lo, cur_hi) = 0.0, spans[0]
    for lo, hi in spans[1:]:
        if lo > cur_hi:
            busy += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    busy += cur_hi - cur_lo
    window = max(hi for _, hi in spans) - spans[0][0]
    return round(busy / window, 4) if window > 0 else 1.0


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 3) if xs else None


async def run_rollout(cfg: RolloutConfig, engine_url: str | list[str], out_dir: str | Path, *, episodes: int,
                      concurrency: int, progress: bool = True, tasks: list | None = None) -> dict[str, Any]:
    """`episodes` episodes over the suite's tasks (cycled), `concurrency` at a time, each through a
    harness drawn by weight (`gym.harness_mix`; one harness: always it); the report, with a
    "harnesses" section of one report per harness when there are several, is also written to
    out_dir/report.json. `tasks`: the suite's tasks, loaded once by the caller (None: loaded now)."""
    from tqdm import tqdm

    with Rollout(cfg, engine_url, out_dir, tasks=tasks) as ro:
        order = list(itertools.islice(itertools.cycle(ro.tasks), episodes))
        mix = HarnessMix(ro.stack.harness_weights, cfg.seed)
        harnesses = [mix.draw() for _ in order]
        ro.prewarm(order[:concurrency], harnesses[:concurrency])
        sem = asyncio.Semaphore(concurrency)
        done: list[Trajectory] = []
        bar = tqdm(total=episodes, disable=not progress, unit="ep", dynamic_ncols=True)
        t0 = time.monotonic()

        async def one(task_id: str, harness: str) -> None:
            async with sem:
                traj = await ro.run_cancellable(task_id, harness=harness)
            done.append(traj)
            scored = [t for t in done if t.reward is not None]
            toks = sum(len(c.completion_ids) for t in done for c in t.calls)
            bar.set_postfix(success=f"{sum(t.reward >= 1 for t in scored)}/{len(scored)}",
                            tok_s=f"{toks / (time.monotonic() - t0):.1f}")
            bar.update(1)

        await asyncio.gather(*(one(t, h) for t, h in zip(order, harnesses)))
        bar.close()
        rep = report(done, time.monotonic() - t0)
        rep.update({"harness": cfg.harness, "suite": cfg.suite, "model": cfg.model, "concurrency": concurrency})
        if len(mix.names) > 1:
            rep["harnesses"] = {h: report([t for t in done if t.harness == h]) | {"weight": mix.weights[h]}
                                for h in mix.names}
        (Path(out_dir) / "report.json").write_text(json.dumps(rep, indent=2))
        return rep
