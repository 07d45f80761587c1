"""Shared by the adapter / episode / rollout tests: a Docker backend with the base image
(or a skip), a scripted-engine stack, a built-in task that has a gold plan, and a train run
in a thread of its own with a wait for what it does."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest


def docker_backend():
    """A DockerBackend whose base image is built; skips the test where either is missing."""
    try:
        from harnessrl.sandboxes.docker import DockerBackend
        from harnessrl.sandboxes.images import base_image_tag
        backend = DockerBackend()
        backend.client.images.get(base_image_tag())
    except Exception as e:  # noqa: BLE001 - any failure means docker sandboxes cannot run here
        pytest.skip(f"docker sandboxes unavailable: {e}")
    return backend


@contextlib.contextmanager
def scripted_stack():
    """(scripted engine, proxy in front of it, docker backend) for episode tests: tiny-llama's
    tokenizer, real HTTP on loopback; the backend's containers are reaped afterwards."""
    backend = docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    with ServedApp(engine.app()) as served, \
            ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as proxy:
        yield engine, proxy, backend
    backend.reap(run_id=backend.run_id)


def builtin_task():
    from harnessrl.gym.tasks.suites.builtin import SUITE_DIR, TASKS_FILE
    from harnessrl.gym.tasks import Task

    try:
        from harnessrl.gym.tasks.suites.builtin import load
        tasks = load()
    except ImportError:  # the suite loader not there yet: read the shipped file directly
        tasks = []
        for line in TASKS_FILE.read_text().splitlines():
            d = json.loads(line)
            d["source"] = str(SUITE_DIR / d["source"])
            tasks.append(Task.model_validate(d))
    return next(t for t in tasks if t.gold_plan)


def real_model_stack(cap: int, model: str = "smollm2-135m"):
    """(proxy handle, docker backend) over a prepared model on the local CPU engine (the real
    SmolLM2-135M by default; `tiny-llama` is SmolLM2's tokenizer, chat template and 8k context
    over 2 random-init layers, whose prefill of a harness's 2k-7k token prompt takes well
    under a second where SmolLM2's takes 20-60 s on this CPU), its completions capped at `cap`
    tokens; a generator for a module fixture (skips when the model is not prepared)."""
    backend = docker_backend()
    from harnessrl.gym.models import ModelNotPrepared, resolve_model
    try:
        resolve_model(model)
    except ModelNotPrepared as e:
        pytest.skip(str(e))
    from harnessrl.gym.episode import ProxyHandle
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.trainers.engine.config import EngineConfig
    from harnessrl.trainers.engine.runner import EngineServer

    with EngineServer(EngineConfig(model=model, port=0)) as eng, \
            ProxyServer(ProxyConfig(engine_url=eng.url, model=model, max_tokens_cap=cap)) as proxy:
        yield ProxyHandle.of(proxy), backend
    backend.reap(run_id=backend.run_id)


def check_sampled_episode(res, cap: int) -> None:
    """A sampling policy's episode ended with a reason and its record is whole and token-exact:
    every call sampled 1..`cap` tokens with their logprobs, and each segment holds its last
    call's prompt + completion with the loss mask on exactly its calls' completions."""
    traj = res.trajectory
    assert res.reason in ("submitted", "harness_exited", "call_limit", "harness_crashed", "timeout"), \
        (res.reason, res.error, traj.metadata.get("harness_stderr_tail"))
    assert traj.termination == res.reason and traj.status == res.status
    assert res.status in ("ok", "truncated") and traj.reward in (0.0, 1.0)
    assert traj.calls, "the harness made no model call"
    traj.validate()
    for call in traj.calls:
        assert call.prompt_ids and 0 < len(call.completion_ids) <= cap
        assert len(call.logprobs) == len(call.completion_ids) and all(lp <= 0 for lp in call.logprobs)
    for i, seg in enumerate(traj.segments):
        calls = [c for c in traj.calls if c.segment == i]
        last = calls[-1]
        assert seg.token_ids[:len(last.prompt_ids) + len(last.completion_ids)] == last.prompt_ids + last.completion_ids
        assert [t for t, m in zip(seg.token_ids, seg.loss_mask) if m] == [t for c in calls for t in c.completion_ids]


def until(condition, what: str, limit_s: float = 300.0) -> None:
    """Wait for `condition` (a readiness wait, not a timed assertion: the limit only ends a hang)."""
    end = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


def train_in_thread(cfg) -> tuple[threading.Thread, dict]:
    """`trainers.loop.train(cfg)` started in a daemon thread; the dict gets "history" or "error"."""
    from harnessrl.trainers.loop import train

    results: dict = {}

    def run() -> None:
        try:
            results["history"] = asyncio.run(train(cfg))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            results["error"] = e

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    return runner, results
