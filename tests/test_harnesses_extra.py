"""The config-only harnesses in examples/harnesses/ beyond the built-in five (pi, Kilo Code CLI,
Continue CLI, Cline CLI, Qwen Code), each run through the generic command adapter with no module of its own.

- their recorded requests (tests/fixtures/harness-requests-extra/, made by record.py there)
  are accepted by the proxy and recorded token-exact;
- `check-adapter` on each, in real Docker with the real binary: gold plan reward 1.0, empty
  plan 0.0, token-exact records, every ending with its reason;
- a short episode with a sampling policy on the local engine ends with a reason and a complete
  record (Qwen Code's 19k-token first prompt is past SmolLM2's 8k context: that episode must
  end context_exceeded with the refused prompt's size recorded). The policy is `tiny-llama`:
  SmolLM2's tokenizer, chat template and context over 2 random-init layers; SmolLM2's own
  weights would spend 20-60 s prefilling each 2k-7k token prompt (test_adapters_real_model
  runs them through mini-swe-agent).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, check_sampled_episode, docker_backend, real_model_stack  # noqa: E402
from proxy_helpers import check_exact, fill_placeholders, post, sse_events, tiny_dialect_env  # noqa: E402

from harnessrl.adapters import get_adapter  # noqa: E402
from harnessrl.adapters.toolchain import installed_spec, toolchain_root  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "harnesses"
FIXTURES = Path(__file__).parent / "fixtures" / "harness-requests-extra"
#: config stem -> (package spec pinned, the shell tool the scripted policy drives)
EXTRA = {"pi": ("@mariozechner/pi-coding-agent@0.73.1", "bash"),
         "kilo": ("@kilocode/cli@7.7.7", "bash"),
         "continue": ("@continuedev/cli@1.5.47", "Bash"),
         "cline": ("cline@3.0.65", "run_commands"),
         "qwen-code": ("@qwen-code/qwen-code@0.24.4", "run_shell_command")}
#: The context a harness's first prompt needs, where SmolLM2's 8k is not enough.
LONG_CONTEXT = {"qwen-code": 32768}


def _config(name: str) -> str:
    return str(EXAMPLES / f"{name}.toml")


def _require_installed(adapter) -> None:
    """Skip, naming the install command, unless the config's harness is in the toolchain."""
    check = getattr(adapter, "check_installed", None)
    if callable(check):
        try:
            check()
            return
        except Exception as e:  # noqa: BLE001 - HarnessNotInstalled / NodeTooOld: the message says what to do
            pytest.skip(str(e))
    spec = adapter.install.split(":", 1)[1]
    if installed_spec("npm", adapter.config.npm_prefix or adapter.name) != spec:
        pytest.skip(f"{adapter.name} not installed in {toolchain_root()}: "
                    f"run `harnessrl harness install {_config(adapter.name)}`")


# -- fast: the configs and the recorded requests ----------------------------------------------
@pytest.mark.parametrize("name", sorted(EXTRA))
def test_config_loads_with_a_pinned_install_and_capabilities(name):
    a = get_adapter(_config(name))
    spec, _ = EXTRA[name]
    assert (a.name, a.dialect, a.placement, a.streams) == (name, "openai-chat", "inside", True)
    assert a.install == f"npm:{spec}" and spec.endswith("@" + a.version)
    assert type(a).__name__ == "CommandAdapter"  # no module of its own: configuration alone


def test_scripted_policy_drives_each_shell_tool_as_recorded():
    """The gold plan goes through each harness's own shell tool, in the argument shape its
    recorded schema asks for (Cline's `run_commands` takes a list of command lines)."""
    from harnessrl.gym.doubles.scripted import ScriptedPolicy

    for name, (_, tool) in EXTRA.items():
        tools = [t["function"] for t in _fixture(name)[0]["body"]["tools"]]
        text = ScriptedPolicy(tokenizer=None)._call(tools, "echo hi")
        call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        want = {"commands": ["echo hi"]} if name == "cline" else {"command": "echo hi"}
        assert call == {"name": tool, "arguments": want}, name


def _fixture(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_recorded_requests_are_the_harness_at_its_pin(name):
    a = get_adapter(_config(name))
    recs = _fixture(name)
    assert len(recs) >= 2 and [r["call"] for r in recs] == list(range(len(recs)))
    assert {(r["harness"], r["version"], r["method"], r["path"]) for r in recs} == \
        {(name, a.version, "POST", "/v1/chat/completions")}
    first, last = recs[0]["body"], recs[-1]["body"]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert EXTRA[name][1] in [t["function"]["name"] for t in first["tools"]]
    # The second call carries the shell step back: an assistant tool call, then its result.
    roles = [m["role"] for m in last["messages"]]
    assert roles[-2:] == ["assistant", "tool"] and last["messages"][-2]["tool_calls"][0]["function"]["name"] == \
        EXTRA[name][1]
    assert all(r["headers"]["authorization"] == "<redacted>" for r in recs)


@pytest.fixture()
def env():
    with tiny_dialect_env() as e:
        yield e


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_proxy_accepts_the_recorded_requests_token_exact(env, name):
    sid, key = env.proxy.open_session({"harness": name})
    n0 = len(env.eng.calls)
    recs = _fixture(name)
    for rec in recs:
        body = fill_placeholders(rec["body"], model="probe-model")
        r = post(env.proxy.url + f"/s/{sid}" + rec["path"], key, body)
        assert r.status_code == 200, r.text
        events = sse_events(r.text)
        assert events[-1][1] == "[DONE]"
        assert json.loads(events[-2][1])["usage"]["prompt_tokens"] > 0  # include_usage honoured
    traj = env.proxy.trajectory(sid)
    assert len(traj.calls) == len(recs)
    check_exact(traj, env.eng.calls[n0:])


# -- end to end: check-adapter in Docker with the real binaries --------------------------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(EXTRA))
def test_check_adapter_passes_gold_empty_and_token_exact(name):
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    adapter = get_adapter(_config(name))
    _require_installed(adapter)
    # A generous wall clock: Kilo's 170 MB binary takes minutes to start on two loaded cores.
    report = check_adapter(_config(name), backend="docker", wall_time_s=480, context=LONG_CONTEXT.get(name))
    checks = {c.name: c for c in report.checks}
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert report.ok, failed
    for label, want in (("gold", "1.0"), ("empty", "0.0")):
        assert checks[f"{label}: ends with a reason"].detail.startswith("submitted (ok)")
        assert checks[f"{label}: reward {want}"].detail.startswith(f"reward {want}, harness submitted")
    # Gold: the shell step and the final answer are two recorded calls at least; empty: one at least.
    assert int(checks["gold: token-exact record"].detail.split()[0]) >= 2
    assert int(checks["empty: token-exact record"].detail.split()[0]) >= 1


# -- the real policy --------------------------------------------------------------------------
CAP = 16


@pytest.fixture(scope="module")
def real_stack():
    yield from real_model_stack(CAP, "tiny-llama")


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", sorted(EXTRA))
def test_real_policy_episode_ends_with_reason_and_complete_record(real_stack, name):
    from harnessrl.gym.episode import EpisodeConfig, run_episode

    adapter = get_adapter(_config(name))
    _require_installed(adapter)
    handle, backend = real_stack
    res = run_episode(builtin_task(), adapter, lambda s, m: backend.create(s, mounts=m), handle, "policy",
                      # CPU prefill of 2k-6k tokens, under load. A refused call counts against the
                      # budget, so a budget of 1 would end that episode as call_limit, not context.
                      EpisodeConfig(max_calls=2 if name in LONG_CONTEXT else 1, wall_time_s=1200))
    traj = res.trajectory
    if name in LONG_CONTEXT:
        assert (res.reason, res.status, traj.termination) == ("context_exceeded", "truncated", "context_exceeded")
        refused = traj.calls[-1]
        assert refused.flags.get("detached") == "refused" and refused.flags["prompt_tokens"] > 8192
        assert not refused.completion_ids
        return
    check_sampled_episode(res, CAP)


def test_check_adapter_looks_for_a_variant_where_its_binary_is(tmp_path, monkeypatch):
    """claude-code-agents runs the claude-code install: check-adapter's `installed` check (and so
    bench/harness_matrix.py) must look in that folder, not one named after the variant."""
    from harnessrl.gym.tools.check_adapter import CheckReport, _installed

    monkeypatch.setenv("HARNESSRL_TOOLCHAIN", str(tmp_path))
    spec = get_adapter("claude-code").install.split(":", 1)[1]
    report = CheckReport("claude-code-agents")
    assert not _installed(report, get_adapter("claude-code-agents"))
    (tmp_path / "npm" / "claude-code").mkdir(parents=True)
    (tmp_path / "npm" / "claude-code" / ".harnessrl-installed").write_text(spec + "\n")
    assert _installed(report, get_adapter("claude-code-agents")), report.checks[-1].detail
