"""A short episode with the real SmolLM2-135M policy on the local CPU engine: it will not solve
the task; the run must end with a reason and leave a complete, valid, token-level record.

Only mini-swe-agent runs here: its prompt (~1.2k tokens) fits SmolLM2's 8k context with room
to spare on a shared 2-core machine; the other harnesses' system prompts (7k-13k tokens)
are exercised with the scripted policy in tests/test_adapters.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task  # noqa: E402
from harnessrl.adapters.toolchain import installed_spec

pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.model, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_mini_swe_agent_with_smollm2_ends_with_reason_and_complete_record():
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    try:
        from harnessrl.sandboxes.docker import DockerBackend
        from harnessrl.sandboxes.images import base_image_tag
        backend = DockerBackend()
        backend.client.images.get(base_image_tag())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"docker sandboxes unavailable: {e}")
    from harnessrl.gym.models import ModelNotPrepared, resolve_model
    try:
        resolve_model("smollm2-135m")
    except ModelNotPrepared as e:
        pytest.skip(str(e))
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.trainers.engine.config import EngineConfig
    from harnessrl.trainers.engine.runner import EngineServer

    task = builtin_task()
    with EngineServer(EngineConfig(model="smollm2-135m", port=0)) as eng, \
            ProxyServer(ProxyConfig(engine_url=eng.url, model="smollm2-135m", max_tokens_cap=24)) as proxy:
        res = run_episode(task, MiniSweAgentAdapter(), lambda s, m: backend.create(s, mounts=m),
                          ProxyHandle(proxy.url, proxy.admin_token, engine_url=eng.url), "policy",
                          EpisodeConfig(max_calls=1, wall_time_s=600))
    backend.reap(run_id=backend.run_id)
    traj = res.trajectory
    assert res.reason in ("submitted", "harness_exited", "call_limit", "harness_crashed"), res.error
    assert traj.termination == res.reason and traj.status == res.status and res.status in ("ok", "truncated")
    assert traj.reward in (0.0, 1.0)
    assert len(traj.calls) == 1
    call = traj.calls[0]
    assert call.prompt_ids and 0 < len(call.completion_ids) <= 24
    assert len(call.logprobs) == len(call.completion_ids) and all(lp <= 0 for lp in call.logprobs)
    traj.validate()
    seg = traj.segments[0]
    assert seg.token_ids == call.prompt_ids + call.completion_ids
    assert sum(seg.loss_mask) == len(call.completion_ids)
