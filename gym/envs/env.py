"""A gymnasium interface over real harness episodes, for RL libraries that want an env.

    env = harnessrl.gym.make("harnessrl/swe", harness="examples/harnesses/tiny-agent.toml",
                             suite="builtin", model="tiny-llama")
    obs, info = env.reset(seed=0)        # the harness's first model request
    obs, reward, terminated, truncated, info = env.step(completion_ids)

Contract:
- `reset(seed, options)` starts one episode (task: `options["task_id"]`, else drawn from the
  suite with the env's seeded generator) of the unmodified harness in a real sandbox, and
  returns its first model request. Observation: `{"request": the JSON body the harness sent
  (ASCII JSON, endpoint in info["endpoint"]), "prompt_ids": the prompt token ids the proxy
  rendered, i.e. what the policy is given}`.
- `step(action)`: the action is the policy's completion as token ids (the primary form; the
  action space). A `str` is accepted too: it is tokenized and `<|im_end|>` appended. The
  proxy turns it into the harness's reply exactly as it would a sampled completion; the
  step returns the next request, reward 0.0, or at the end the hidden-test reward.
  `terminated`: the harness finished on its own (submitted, exited, crashed: scored);
  `truncated`: the call limit or the wall-clock limit cut it, or the infrastructure failed
  (then info["status"] == "infra_error", reward 0.0 and info["reward"] None: mask it).
- The terminal observation is empty (`""`, no ids). `info` holds only deterministic plain
  data; the token-level record of the finished episode is `env.unwrapped.trajectory`.
- `close()` tears down the harness (its sandbox is killed and its pending call failed), the
  proxy and the bridge engine. The wall-clock limit of an episode keeps running while the
  env waits for `step()`.

How: the real proxy generates through an in-process bridge engine (gym/envs/env_bridge.py) that
hands each prompt to the env and waits for step()'s action; the harness runs in a
background thread through `run_episode`, exactly as in training.
"""
from __future__ import annotations

import json
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pydantic import Field

from harnessrl.gym.rollout import RolloutConfig

ENV_ID = "harnessrl/swe"
#: json.dumps(..., ensure_ascii=True) writes only these characters.
JSON_CHARSET = "".join(chr(i) for i in range(32, 127))


class SweEnvConfig(RolloutConfig):
    """A `RolloutConfig` (harness, suite, model, sandbox, episode limits) plus the env's own fields."""

    max_request_chars: int = Field(8 * 1024 * 1024, ge=1024)
    """Longest request JSON an observation holds (the Text space's max_length)."""
    step_timeout_s: float | None = Field(None, gt=0)
    """Longest wait for the harness's next request or end after an action; None: the
    episode's wall time plus 15 min for scoring. Past it the episode ends infra_error."""


@dataclass(eq=False)
class _Episode:
    task_id: str
    events: queue.Queue = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    sandbox: Any = None
    closing: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: Any = None
    calls: int = 0
    over: bool = False
    pending_end: tuple | None = None  # an end found at reset, returned by the first step


class SweEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        from harnessrl.gym.models import load_tokenizer

        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r}: this env renders nothing (render_modes is empty)")
        self.config = SweEnvConfig(**kwargs)
        self.tokenizer = load_tokenizer(self.config.model)
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.eos_id is None or self.eos_id == self.tokenizer.unk_token_id:
            self.eos_id = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)
        ids = spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)
        self.observation_space = spaces.Dict({
            "request": spaces.Text(self.config.max_request_chars, min_length=0, charset=JSON_CHARSET),
            "prompt_ids": ids})
        self.action_space = spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)
        self.policy_version = 0
        """Version stamped on the tokens of later actions (set it after a weight update)."""
        self.trajectory = None
        """The closed `Trajectory` of the last finished episode (token-level record, reward)."""
        self.result = None
        """Its `EpisodeResult` (harness result, reward details, timings)."""
        self._episode: _Episode | None = None
        self._stack: dict[str, Any] | None = None
        self._closed = False

    # -- infrastructure (started on the first reset) ---------------------------------------
    def _start(self) -> dict[str, Any]:
        if self._stack is not None:
            return self._stack
        if self._closed:
            raise RuntimeError("this env is closed")
        from harnessrl.gym.envs.env_bridge import BridgeEngine
        from harnessrl.gym.episode import ProxyHandle
        from harnessrl.gym.rollout import Rollout
        from harnessrl.gym.served import ServedApp

        out = tempfile.mkdtemp(prefix="harnessrl-env-")
        bridge = BridgeEngine([self.eos_id], lambda: self.policy_version)
        served = ServedApp(bridge.app()).__enter__()
        try:
            ro = Rollout(self.config, served.url, out).__enter__()
        except BaseException:
            served.__exit__(None, None, None)
            shutil.rmtree(out, ignore_errors=True)
            raise
        bridge.proxy_url = ro.proxy.url
        # Harness and admin traffic go through the bridge's tap, which keeps request bodies.
        handle = ProxyHandle.of(ro.proxy, url=served.url)
        self._stack = {"bridge": bridge, "served": served, "rollout": ro, "handle": handle, "out": out}
        return self._stack

    # -- gymnasium API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._end_episode()
        st = self._start()
        ro = st["rollout"]
        task_ids = list(ro.tasks)
        task_id = (options or {}).get("task_id")
        if task_id is None:
            task_id = task_ids[int(self.np_random.integers(len(task_ids)))]
        elif task_id not in ro.tasks:
            raise ValueError(f"options['task_id'] {task_id!r} is not in suite {self.config.suite!r}")
        ep = _Episode(task_id)
        st["bridge"].attach(ep.events)
        ep.thread = threading.Thread(target=self._run, args=(ep,), name="harnessrl-env-episode", daemon=True)
        self._episode = ep
        ep.thread.start()
        obs, reward, terminated, truncated, info = self._advance(ep)
        if terminated or truncated:  # ended before its first model call (e.g. infra): the next step says so
            ep.over, ep.pending_end = False, (reward, terminated, truncated, dict(info))
        return obs, info

    def step(self, action: Any):
        ep = self._episode
        if ep is None or ep.over:
            raise RuntimeError("step() without a running episode: call reset() first")
        if ep.pending_end is not None:
            ep.over = True
            reward, terminated, truncated, info = ep.pending_end
            return self._empty(), reward, terminated, truncated, info
        ids = self._action_ids(action)
        turn, ep.turn = ep.turn, None
        ep.calls += 1
        turn.answer(ids)
        return self._advance(ep)

    def close(self) -> None:
        self._end_episode()
        st, self._stack = self._stack, None
        self._closed = True
        if st is None:
            return
        st["rollout"].__exit__(None, None, None)
        st["served"].__exit__(None, None, None)
        shutil.rmtree(st["out"], ignore_errors=True)

    # -- the episode thread and its events -----------------------------------------------------
    def _run(self, ep: _Episode) -> None:
        st = self._stack
        ro = st["rollout"]

        def make_sandbox(spec, mounts):  # a fresh sandbox the env can kill mid-episode (`_end_episode`)
            sb = ro.stack.make_sandbox(spec, mounts)
            with ep.lock:
                ep.sandbox = sb
                closing = ep.closing
            if closing:
                sb.close()
                raise RuntimeError("the env closed this episode")
            return sb

        try:
            res = ro.stack.run(ep.task_id, st["handle"], sandboxes=make_sandbox)
            ep.events.put(("done", res))
        except BaseException as e:  # noqa: BLE001 - reported to step() as an infra error
            ep.events.put(("failed", f"{type(e).__name__}: {e}"))

    def _advance(self, ep: _Episode):
        timeout = self.config.step_timeout_s or self.config.episode.wall_time_s + 900
        try:
            kind, item = ep.events.get(timeout=timeout)
        except queue.Empty:
            kind, item = "failed", f"no request or end from the harness within {timeout:.0f} s"
            self._end_episode()
        if kind == "turn":
            ep.turn = item
            request = json.dumps(item.call.body, ensure_ascii=True) if item.call is not None else ""
            if len(request) > self.config.max_request_chars:
                self._end_episode()
                return self._end(ep, None, "infra_error", "observation_too_large",
                                 f"request of {len(request)} chars > max_request_chars")
            obs = {"request": request, "prompt_ids": np.asarray(item.prompt_ids, dtype=np.int64)}
            info = {"task_id": ep.task_id, "call": ep.calls, "status": "running",
                    "endpoint": item.call.endpoint if item.call is not None else "",
                    "max_new_tokens": item.max_new_tokens}
            return obs, 0.0, False, False, info
        if kind == "done":
            self.result, self.trajectory = item, item.trajectory
            return self._end(ep, item.trajectory.reward, item.status, item.reason, item.error)
        return self._end(ep, None, "infra_error", "infra", item)

    def _end(self, ep: _Episode, reward: float | None, status: str, termination: str, error: str):
        ep.over = True
        if ep.thread is not None:
            ep.thread.join(timeout=60)
        terminated = status == "ok"
        info = {"task_id": ep.task_id, "call": ep.calls, "status": status, "termination": termination,
                "reward": reward, "error": error}
        reward_out = float(reward) if (reward is not None and status != "infra_error") else 0.0
        return self._empty(), reward_out, terminated, not terminated, info

    def _empty(self) -> dict[str, Any]:
        return {"request": "", "prompt_ids": np.zeros(0, dtype=np.int64)}

    def _action_ids(self, action: Any) -> list[int]:
        if isinstance(action, str):
            return self.tokenizer.encode(action, add_special_tokens=False) + [self.eos_id]
        arr = np.asarray(action)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"action: a 1-D sequence of integer token ids (or a str) is required; "
                             f"got shape {arr.shape} dtype {arr.dtype}")
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise ValueError(f"action: token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        return [int(t) for t in arr]

    def _end_episode(self) -> None:
        """Stop a running episode: kill its sandbox first (so no reward is computed), then fail
        its waiting model call (the harness sees a 502 and exits); wait for the thread."""
        ep, st = self._episode, self._stack
        if ep is None:
            return
        self._episode = None
        with ep.lock:
            ep.closing = True
            sandbox = ep.sandbox
        if ep.thread is not None and ep.thread.is_alive():
            if sandbox is not None:
                try:
                    sandbox.close()
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if st is not None:
            st["bridge"].detach()
        if ep.thread is not None:
            ep.thread.join(timeout=self.config.episode.wall_time_s + 120)
            if ep.thread.is_alive():
                raise RuntimeError(f"the episode of task {ep.task_id!r} did not stop; its harness may hang")


def register() -> None:
    """Register ENV_ID with gymnasium's registry (idempotent)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="harnessrl.gym.envs.env:SweEnv", nondeterministic=False)


register()
