"""A short episode per adapter with a sampling policy on the local CPU engine (not a script):
it will not solve the task; each run must end with a reason and leave a complete, valid,
token-level record (closed with its termination, loss mask exactly on the sampled tokens).

Every adapter runs with `tiny-llama` (SmolLM2's real tokenizer, chat template and 8k context
over 2 random-init layers: the same prompts, the same refusals, sampled tokens that are not a
tool call) and mini-swe-agent, the default harness, also with the real SmolLM2-135M weights.
The harnesses' own system prompts are 1k-7k tokens: SmolLM2 prefills one in 20-60 s on this
CPU, so one harness carries the real weights (the engine's agreement with HF and the learning
runs test those weights elsewhere). The call budget is 1 and completions are capped at 16
tokens to keep each episode short.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, check_sampled_episode, real_model_stack  # noqa: E402
from harnessrl.adapters import get_adapter  # noqa: E402
from harnessrl.adapters.toolchain import installed_spec  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.model, pytest.mark.slow]
CAP = 16


HARNESSES = ["mini-swe-agent", "codex", "claude-code", "opencode", "aider", "gemini-cli"]
CASES = [pytest.param(h, "tiny-llama", id=h) for h in HARNESSES] + \
    [pytest.param("mini-swe-agent", "smollm2-135m", id="mini-swe-agent-smollm2")]


@pytest.fixture(scope="module")
def stacks():
    """model name -> (proxy handle, docker backend), each stack started on first use."""
    made: dict = {}
    with contextlib.ExitStack() as started:
        def get(model: str):
            if model not in made:
                gen = real_model_stack(CAP, model)
                made[model] = next(gen)
                started.callback(next, gen, None)
            return made[model]
        yield get


@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness,model", CASES)
def test_real_policy_episode_ends_with_reason_and_complete_record(stacks, harness, model):
    from harnessrl.gym.episode import EpisodeConfig, run_episode

    adapter = get_adapter(harness)
    kind, spec = adapter.install.split(":", 1)
    if installed_spec("npm" if kind == "npm" else "venvs", harness) != spec:
        pytest.skip(f"{harness} not installed: run scripts/install_harnesses.sh {harness}")
    handle, backend = stacks(model)
    res = run_episode(builtin_task(), adapter, lambda s, m: backend.create(s, mounts=m), handle, "policy",
                      EpisodeConfig(max_calls=1, wall_time_s=600))
    check_sampled_episode(res, CAP)
