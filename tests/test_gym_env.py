"""The gymnasium interface on real parts: a real harness process (the tiny tool-calling agent of
examples/harnesses/tiny-agent.toml, run by the command adapter; mini-swe-agent when installed)
in real Docker sandboxes, the real proxy, the real tokenizer; the policy is the test."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "harnesses" / "tiny-agent.toml")
TASK = "harnessrl-builtin__calc-1"

pytestmark = [pytest.mark.docker]



def _make(**kw):
    import harnessrl.gym

    docker_backend()
    args = dict(harness=TINY, suite="builtin", model="tiny-llama", sandbox="docker",
                tasks=[TASK, "harnessrl-builtin__calc-2"])
    return harnessrl.gym.make("harnessrl/swe", **{**args, **kw})


@pytest.fixture(scope="module")
def env():
    e = _make()
    yield e
    e.close()


def _gold_policy(env):
    from harnessrl.gym.doubles.scripted import ScriptedPolicy
    from harnessrl.gym.stack import load_suite_tasks

    u = env.unwrapped
    tasks = load_suite_tasks(u.config)
    pol = ScriptedPolicy(u.tokenizer, {t.problem_statement: list(t.gold_plan) for t in tasks})

    def act(obs) -> np.ndarray:
        text, _, _ = pol.decide(u.tokenizer.decode(obs["prompt_ids"].tolist(), skip_special_tokens=False))
        return np.asarray(u.tokenizer.encode(text, add_special_tokens=False) + [u.eos_id], dtype=np.int64)
    return act


def test_import_is_light_and_make_registers():
    code = ("import sys, harnessrl.gym as g; assert callable(g.make); "
            "print(sorted(m for m in ('gymnasium', 'ray', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import gymnasium

    import harnessrl.gym.envs.env  # noqa: F401 - registers on import
    assert gymnasium.spec("harnessrl/swe").entry_point == "harnessrl.gym.envs.env:SweEnv"


@pytest.mark.timeout(600)
def test_check_env_passes(env):
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    gym_warnings = [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)]
    assert gym_warnings == []


@pytest.mark.timeout(300)
def test_gold_policy_reaches_reward_one_and_the_record_matches_the_steps(env):
    act = _gold_policy(env)
    obs, info = env.reset(seed=1, options={"task_id": TASK})
    task = env.unwrapped._stack["rollout"].tasks[TASK]
    request = __import__("json").loads(obs["request"])
    assert info == {"task_id": TASK, "call": 0, "status": "running", "endpoint": "/v1/chat/completions",
                    "max_new_tokens": 512}
    assert request["messages"][1] == {"role": "user", "content": task.problem_statement}
    assert [t["function"]["name"] for t in request["tools"]] == ["bash"]
    assert obs in env.observation_space
    seen, actions = [obs["prompt_ids"].tolist()], []
    for _ in range(10):
        action = act(obs)
        actions.append(action.tolist())
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
        assert reward == 0.0 and obs["prompt_ids"].size
        seen.append(obs["prompt_ids"].tolist())
    assert (terminated, truncated, reward) == (True, False, 1.0)
    assert info["status"] == "ok" and info["termination"] == "submitted" and info["reward"] == 1.0
    assert obs["request"] == "" and obs["prompt_ids"].size == 0
    assert len(actions) == len(task.gold_plan) + 1  # the plan's tool calls, then a final answer
    # The token-level record holds exactly what the policy was shown and what it returned.
    traj = env.unwrapped.trajectory
    assert [c.prompt_ids for c in traj.calls] == seen
    assert [c.completion_ids for c in traj.calls] == actions
    assert traj.reward == 1.0 and traj.status == "ok"
    assert all(v == 0 for c in traj.calls for v in c.versions)


@pytest.mark.timeout(300)
def test_random_actions_end_with_a_reason(env):
    from harnessrl.gym.episode import ENDINGS

    env.action_space.seed(7)
    obs, info = env.reset(seed=7)
    for _ in range(40):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert terminated or truncated
    assert info["termination"] in ENDINGS and info["status"] in ("ok", "truncated")
    assert reward == 0.0 and info["reward"] == 0.0  # random text fixes nothing, and is scored
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_space.sample())


@pytest.mark.timeout(300)
def test_bad_actions_are_refused_with_the_reason(env):
    env.reset(seed=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        env.step(np.array([5, env.unwrapped.vocab_size]))
    with pytest.raises(ValueError, match="1-D sequence of integer"):
        env.step(np.array([[1, 2]]))
    obs, reward, terminated, truncated, info = env.step("All done.")  # text is accepted too
    assert terminated and info["termination"] == "submitted"


@pytest.mark.timeout(300)
def test_reset_mid_episode_tears_it_down_as_infra_error(env):
    env.reset(seed=0, options={"task_id": TASK})
    u = env.unwrapped
    first = u._episode
    sandbox = first.sandbox
    assert sandbox is not None and sandbox.alive()
    env.reset(seed=0, options={"task_id": TASK})
    assert not first.thread.is_alive() and not sandbox.alive()
    proxy = u._stack["rollout"].proxy
    sids = [sid for sid, s in proxy.core.sessions.items() if s.closed]
    torn = proxy.trajectory(sids[-1])
    assert (torn.status, torn.termination, torn.reward) == ("infra_error", "sandbox_died", None)


@pytest.mark.timeout(300)
def test_call_limit_is_truncated():
    e = _make(episode={"max_calls": 2})
    try:
        obs, _ = e.reset(seed=0, options={"task_id": TASK})
        steps = 0
        while True:
            call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
            obs, reward, terminated, truncated, info = e.step(call)
            steps += 1
            if terminated or truncated:
                break
        assert (steps, terminated, truncated) == (2, False, True)
        assert info["termination"] == "call_limit" and info["status"] == "truncated" and reward == 0.0
    finally:
        e.close()


@pytest.mark.timeout(300)
def test_infra_failure_ends_the_episode_as_infra_error(tmp_path):
    cfg = tmp_path / "missing.toml"
    cfg.write_text('name = "missing"\ndialect = "openai-chat"\nplacement = "beside"\n'
                   'command = ["/nonexistent/harness-binary"]\n')
    e = _make(harness=str(cfg))
    try:
        obs, info = e.reset(seed=0)
        assert info["status"] == "infra_error" and obs["prompt_ids"].size == 0
        obs, reward, terminated, truncated, info = e.step(np.array([1], dtype=np.int64))
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["reward"] is None and "nonexistent" in info["error"]
    finally:
        e.close()
    e.close()  # closing twice is fine


@pytest.mark.harness
@pytest.mark.timeout(600)
def test_mini_swe_agent_gold_policy_reaches_reward_one():
    from harnessrl.adapters.toolchain import installed_spec

    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    e = _make(harness="mini-swe-agent")
    try:
        act = _gold_policy(e)
        obs, info = e.reset(seed=0, options={"task_id": TASK})
        for _ in range(10):
            obs, reward, terminated, truncated, info = e.step(act(obs))
            if terminated or truncated:
                break
        assert (terminated, reward, info["termination"]) == (True, 1.0, "submitted")
    finally:
        e.close()
