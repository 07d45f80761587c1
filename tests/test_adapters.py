"""Every adapter, end to end: a real harness binary on a real built-in task in a real Docker
sandbox, through the real proxy, driven by the scripted policy (real tokenizer ids).

gold plan -> reward 1.0; empty plan -> reward 0.0; and the recorded trajectory is
token-exact: every recorded call's prompt and completion ids are exactly what the engine was
given and returned, and each segment's loss-masked tokens are exactly the sampled ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harnessrl.adapters import REGISTRY, adapter_class, get_adapter
from harnessrl.adapters.base import REASONS, Endpoint, HarnessAdapter, HarnessResult, classify_exit
from harnessrl.adapters.toolchain import installed_spec, toolchain_root

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "harnesses"


# -- fast contract checks (no docker) ----------------------------------------------------------
def test_registry_resolves_every_adapter_and_declares_capabilities():
    for name in REGISTRY:
        if name == "command":
            continue
        a = get_adapter(name)
        assert isinstance(a, HarnessAdapter)
        assert a.name == name
        assert a.dialect in ("openai-chat", "openai-responses", "anthropic", "gemini")
        assert a.placement in ("inside", "beside")
        assert a.install.split(":")[0] in ("npm", "pip")
        assert a.version in a.install
    assert adapter_class("harnessrl.adapters.codex:CodexAdapter").dialect == "openai-responses"
    with pytest.raises(ValueError, match="unknown harness 'nope'.*mini-swe-agent"):
        get_adapter("nope")


def test_example_configs_load_and_bad_configs_name_the_problem(tmp_path):
    mini = get_adapter(str(EXAMPLES / "mini-swe-agent.toml"))
    assert (mini.name, mini.dialect, mini.placement) == ("mini-swe-agent-cmd", "openai-chat", "beside")
    codex = get_adapter(str(EXAMPLES / "codex.toml"))
    assert (codex.dialect, codex.placement) == ("openai-responses", "inside")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ndialect = "openai-chat"\nplacement = "nearby"\ncommand = ["x"]\n')
    with pytest.raises(ValueError, match="(?s)bad.toml: invalid harness config.*placement"):
        get_adapter(str(bad))
    bad.write_text('name = "x"\ndialect = "openai-chat"\nplacement = "beside"\ncommand = ["x"]\n'
                   '[completion]\nstatus_reasons = { Done = "finished" }\n')
    with pytest.raises(ValueError, match="completion reason 'finished'"):
        get_adapter(str(bad))


def test_endpoint_inside_url_keeps_the_session_path():
    ep = Endpoint("http://127.0.0.1:4321/s/abc", "k", "policy", "/tmp/x")
    assert ep.path == "/s/abc"
    assert ep.inside_base_url == "http://127.0.0.1:18080/s/abc"


def test_exit_classification_and_result_validation():
    assert classify_exit(0, False) == "submitted"
    assert classify_exit(1, False) == "harness_exited"
    assert classify_exit(137, False) == "harness_crashed"
    assert classify_exit(None, True) == "timeout"
    assert set(REASONS) >= {"submitted", "harness_exited", "call_limit", "timeout", "harness_crashed"}
    with pytest.raises(ValueError, match="reason 'done' not one of"):
        HarnessResult("done", 0)


# -- end to end ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack():
    """Scripted engine + proxy + docker backend, shared by the module's episodes."""
    backend = docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    try:
        tok = load_tokenizer("tiny-llama")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"tiny-llama tokenizer not prepared: {e}")
    engine = ScriptedEngine(tok)
    with ServedApp(engine.app()) as served, \
            ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as proxy:
        yield engine, proxy, backend
    backend.reap(run_id=backend.run_id)


def _require(adapter) -> None:
    kind = "npm" if adapter.install.startswith("npm:") else "venvs"
    name = adapter.name.removesuffix("-cmd")
    if installed_spec(kind, name) != adapter.install.split(":", 1)[1]:
        pytest.skip(f"{name} not installed in {toolchain_root()}: run scripts/install_harnesses.sh {name}")


def _episode(stack, harness: str, gold: bool):
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode

    engine, proxy, backend = stack
    adapter = get_adapter(harness)
    _require(adapter)
    task = builtin_task()
    engine.set_tasks([task], gold=gold)
    start = len(engine.calls)
    res = run_episode(task, adapter, lambda spec, mounts: backend.create(spec, mounts=mounts),
                      ProxyHandle.of(proxy), "policy",
                      EpisodeConfig(max_calls=8, wall_time_s=240))
    return res, engine.calls[start:], task


def assert_token_exact(traj, engine_calls) -> None:
    from harnessrl.gym.tools.check_adapter import token_exact_problems

    assert token_exact_problems(traj, engine_calls) == []


def test_token_exact_check_catches_a_tampered_record():
    from harnessrl.gym.tools.check_adapter import token_exact_problems
    from harnessrl.gym.doubles.scripted import ScriptedCall
    from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory

    sampled = [ScriptedCall([1, 5, 6], [7, 2], "x", None, 0), ScriptedCall([1, 5, 6, 7, 2, 9], [8, 2], "y", None, 1)]
    calls = [CallRecord("a", "s", 0, "openai-chat", 0, [1, 5, 6], [7, 2], [-0.1] * 2, [0] * 2, "stop", 0),
             CallRecord("b", "s", 1, "openai-chat", 5, [9], [8, 2], [-0.1] * 2, [0] * 2, "stop", 0)]
    seg = Segment([1, 5, 6, 7, 2, 9, 8, 2], [0, 0, 0, 1, 1, 0, 1, 1], [0.0] * 3 + [-0.1] * 2 + [0.0] + [-0.1] * 2,
                  [-1, -1, -1, 0, 0, -1, 0, 0], call_ids=["a", "b"])
    traj = Trajectory("s", [seg], calls=calls)
    assert token_exact_problems(traj, sampled) == []
    seg.loss_mask[5] = 1  # a template token marked as sampled
    seg.versions[5] = 0
    assert token_exact_problems(traj, sampled) == ["segment 0: loss-masked tokens are not exactly the sampled ones"]
    seg.loss_mask[5], seg.versions[5] = 0, -1
    calls[1].completion_ids = [8, 3]
    assert "call 1: recorded completion ids differ from the sampled ones" in token_exact_problems(traj, sampled)


E2E = ["mini-swe-agent", str(EXAMPLES / "mini-swe-agent.toml"), "codex", "claude-code", "opencode", "aider",
       "gemini-cli"]


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", E2E, ids=lambda h: Path(h).stem if h.endswith(".toml") else h)
def test_gold_plan_scores_one_and_is_token_exact(stack, harness):
    res, calls, task = _episode(stack, harness, gold=True)
    assert (res.reason, res.status, res.error) == ("submitted", "ok", "")
    assert res.trajectory.reward == 1.0
    assert res.trajectory.termination == "submitted"
    # The plan's commands went through the harness's own shell tool, in order.
    acted = [c for c in calls if c.task_key == task.problem_statement
             and ("<tool_call>" in c.text or "<<<<<<< SEARCH" in c.text)]
    assert acted, "the harness never carried out a scripted action"
    assert res.reward.agent_diff and ".aider" not in res.reward.agent_diff
    own_status = {"mini-swe-agent": "Submitted", "mini-swe-agent.toml": "Submitted", "codex": "turn.completed",
                  "claude-code": "success", "opencode": "stop", "aider": None, "gemini-cli": "response"}
    assert res.harness.harness_status == own_status[Path(harness).name]
    if harness in ("mini-swe-agent", "aider"):  # from a warm interpreter (adapters/prefork.py), not a refusal
        assert res.harness.details["launch"] == "forked"
    beside = harness in ("mini-swe-agent", "aider") or harness.endswith(".toml")
    # beside harnesses ran in a network namespace of their own, only the proxy reachable (adapters/netns.py)
    assert res.trajectory.metadata["harness_network"] == ("proxy-only" if beside else "sandbox")
    assert_token_exact(res.trajectory, calls)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", E2E, ids=lambda h: Path(h).stem if h.endswith(".toml") else h)
def test_empty_plan_scores_zero(stack, harness):
    res, calls, _ = _episode(stack, harness, gold=False)
    assert (res.reason, res.status) == ("submitted", "ok")
    assert res.trajectory.reward == 0.0
    assert res.reward is not None and res.reward.agent_diff == ""
    assert_token_exact(res.trajectory, calls)


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_check_adapter_fails_a_config_that_does_nothing(tmp_path):
    """A harness that exits 0 without calling the model cannot pass the contract checks."""
    from harnessrl.gym.tools.check_adapter import main

    cfg = tmp_path / "noop.toml"
    cfg.write_text('name = "noop"\ndialect = "openai-chat"\nplacement = "beside"\ncommand = ["true"]\n')
    try:
        from harnessrl.sandboxes.docker import DockerBackend
        DockerBackend()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"docker unavailable: {e}")
    import contextlib
    import io
    import json as _json

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(cfg), "--backend", "docker", "--wall-time", "60"])
    report = _json.loads(out.getvalue().strip().splitlines()[-1])
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and report["ok"] is False
    assert checks["loads"]["ok"] and checks["capabilities"]["ok"] and checks["installed"]["ok"]
    assert not checks["gold: reward 1.0"]["ok"] and "reward 0.0" in checks["gold: reward 1.0"]["detail"]
    assert checks["gold: token-exact record"]["detail"] == "no model call was recorded"
    assert checks["empty: reward 0.0"]["ok"]


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness, own_status, exit_code", [
    ("claude-code", "error_max_turns", None),  # --max-turns from the call budget
    ("gemini-cli", "FatalTurnLimitedError", 53),  # maxSessionTurns from the call budget
])
def test_past_the_harness_turn_limit_is_a_call_limit(stack, harness, own_status, exit_code):
    """The harness's own turn limit comes from the call budget; hitting it is a truncation."""
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode

    engine, proxy, backend = stack
    adapter = get_adapter(harness)
    _require(adapter)
    task = builtin_task()
    engine.set_tasks([task], gold=True)
    res = run_episode(task, adapter, lambda spec, mounts: backend.create(spec, mounts=mounts),
                      ProxyHandle.of(proxy), "policy",
                      EpisodeConfig(max_calls=len(task.gold_plan), wall_time_s=240))
    assert (res.reason, res.status, res.harness.harness_status) == ("call_limit", "truncated", own_status), res.harness
    if exit_code is not None:
        assert res.harness.exit_code == exit_code
    assert res.trajectory.termination == "call_limit"
    assert res.trajectory.reward == 1.0  # the plan ran before the turn budget was spent


def test_gemini_cli_settings_and_status():
    """Gemini CLI's offline settings, its tool set, and how its JSON output is read."""
    from harnessrl.adapters.gemini_cli import FULL_TOOLS, TOOLS, GeminiCliAdapter, _status, gemini_settings

    s = gemini_settings(7)
    assert s["security"]["auth"]["selectedType"] == "gemini-api-key" and s["model"]["maxSessionTurns"] == 7
    assert s["privacy"]["usageStatisticsEnabled"] is False and s["telemetry"]["enabled"] is False
    assert s["general"]["enableAutoUpdate"] is False and s["general"]["maxAttempts"] == 3
    assert s["tools"]["core"] == list(TOOLS) and "run_shell_command" in TOOLS
    assert get_adapter("gemini-cli", tools=FULL_TOOLS).tools == FULL_TOOLS
    with pytest.raises(ValueError, match="gemini-cli tools"):
        GeminiCliAdapter(tools="run_shell_command")
    assert _status('Warning: x\n{"session_id": "s", "response": "done", "stats": {}}') == "response"
    err = '{"session_id": "s", "error": {"type": "FatalTurnLimitedError", "message": "Reached max", "code": 53}}'
    assert _status("YOLO mode is enabled.\n" + err) == "FatalTurnLimitedError"
    assert _status("no json {here") is None
    from harnessrl.adapters.toolchain import NodeTooOld, check_node

    check_node(GeminiCliAdapter.node, "20.20.2", "gemini-cli")
    with pytest.raises(NodeTooOld, match="gemini-cli needs node >=20, but the toolchain's node is v18.19.0"):
        check_node(GeminiCliAdapter.node, "18.19.0", "gemini-cli")
