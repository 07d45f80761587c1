"""A short episode per adapter with the real SmolLM2-135M policy on the local CPU engine: it will
not solve the task; each run must end with a reason and leave a complete, valid, token-level
record (closed with its termination, loss mask exactly on the sampled tokens).

Slow by nature: the harnesses' own system prompts are 1k-7k tokens, prefilled on CPU. The
call budget is 1 and completions are capped at 16 tokens to keep each episode short.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, real_model_stack  # noqa: E402
from harnessrl.adapters import get_adapter  # noqa: E402
from harnessrl.adapters.toolchain import installed_spec  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.model, pytest.mark.slow]
CAP = 16


@pytest.fixture(scope="module")
def real_stack():
    yield from real_model_stack(CAP)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness", ["mini-swe-agent", "codex", "claude-code", "opencode", "aider", "gemini-cli"])
def test_real_policy_episode_ends_with_reason_and_complete_record(real_stack, harness):
    from harnessrl.gym.episode import EpisodeConfig, run_episode

    adapter = get_adapter(harness)
    kind, spec = adapter.install.split(":", 1)
    if installed_spec("npm" if kind == "npm" else "venvs", harness) != spec:
        pytest.skip(f"{harness} not installed: run scripts/install_harnesses.sh {harness}")
    handle, backend = real_stack
    res = run_episode(builtin_task(), adapter, lambda s, m: backend.create(s, mounts=m), handle, "policy",
                      EpisodeConfig(max_calls=1, wall_time_s=600))
    traj = res.trajectory
    assert res.reason in ("submitted", "harness_exited", "call_limit", "harness_crashed", "timeout"), res.error
    assert traj.termination == res.reason and traj.status == res.status
    assert res.status in ("ok", "truncated") and traj.reward in (0.0, 1.0)
    assert traj.calls, "the harness made no model call"
    traj.validate()
    for call in traj.calls:
        assert call.prompt_ids and 0 < len(call.completion_ids) <= CAP
        assert len(call.logprobs) == len(call.completion_ids) and all(lp <= 0 for lp in call.logprobs)
    for i, seg in enumerate(traj.segments):
        calls = [c for c in traj.calls if c.segment == i]
        last = calls[-1]
        assert seg.token_ids[:len(last.prompt_ids) + len(last.completion_ids)] == last.prompt_ids + last.completion_ids
        assert [t for t, m in zip(seg.token_ids, seg.loss_mask) if m] == [t for c in calls for t in c.completion_ids]
