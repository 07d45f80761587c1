"""More harnesses of the field by config alone (examples/harnesses/): GitHub Copilot CLI and Letta
Code (npm), gptme and Hermes Agent (pip, inside on the sandbox's python 3.11) and Mistral Vibe
(pip, inside on `python_runtime = "3.13"`: it requires python >= 3.12), each through the generic
command adapter with no module of its own.

- their recorded requests (tests/fixtures/harness-requests-extra/, made by record.py there) are
  the harness at its pin, and the proxy records their model calls token-exact; the endpoint
  probes a harness sends first (Hermes asks for Ollama's and llama.cpp's model info) get a 404 or 405
  (`/v1/models` the served model) and record nothing;
- the scripted policy drives each harness's own shell tool as recorded;
- `check-adapter` on each, in real Docker with the real harness: gold 1.0, empty 0.0,
  token-exact, the first prompt inside SmolLM2's 8k context;
- one episode of each with a sampling policy (tiny-llama) ends with a reason and a whole record. The pip ones are built for the
  sandbox from `install = "pip:..."` alone; the sandbox has no network, so gptme's tokenizer
  download and every other start-up fetch must fail fast, not hang.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import docker_backend  # noqa: E402
from proxy_helpers import check_exact, fill_placeholders, post, sse_events, tiny_dialect_env  # noqa: E402

from harnessrl.adapters import get_adapter  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harnesses"
FIXTURES = Path(__file__).parent / "fixtures" / "harness-requests-extra"
#: config stem -> (install spec, the shell tool the scripted policy drives, python it is built for)
FIELD = {"copilot": ("npm:@github/copilot@1.0.102", "bash", None),
         "letta-code": ("npm:@letta-ai/letta-code@0.25.9", "Bash", None),
         "gptme": ("pip:gptme==0.35.1", "shell", "3.11"),
         "hermes-agent": ("pip:hermes-agent==0.19.0", "terminal", "3.11"),
         "mistral-vibe": ("pip:mistral-vibe==2.26.1", "bash", "3.13")}
CHAT = ("POST", "/v1/chat/completions")


def _config(name: str) -> str:
    return str(EXAMPLES / f"{name}.toml")


def _fixture(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def _chat_calls(name: str) -> list[dict]:
    return [r for r in _fixture(name) if (r["method"], r["path"]) == CHAT]


# -- fast: the configs and the recorded requests ----------------------------------------------
@pytest.mark.parametrize("name", sorted(FIELD))
def test_config_loads_pinned_inside_with_no_module(name):
    a = get_adapter(_config(name))
    spec, _, python = FIELD[name]
    assert (a.name, a.dialect, a.placement, a.streams) == (name, "openai-chat", "inside", True)
    assert a.install == spec and spec.endswith(("@", "==")[spec.startswith("pip:")] + a.version)
    assert type(a).__name__ == "CommandAdapter"
    # Mistral Vibe needs an interpreter the image lacks; the others run on the image's own.
    assert a.config.python_runtime == ("3.13" if python == "3.13" else None)


def test_scripted_policy_drives_each_shell_tool_as_recorded():
    from harnessrl.gym.doubles.scripted import ScriptedPolicy

    for name, (_, tool, _) in FIELD.items():
        tools = [t["function"] for t in _chat_calls(name)[0]["body"]["tools"]]
        text = ScriptedPolicy(tokenizer=None)._call(tools, "echo hi")
        call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        # Copilot's bash also requires a `description`: other required strings get a short text.
        want = {"command": "echo hi"} | ({"description": "scripted step"} if name == "copilot" else {})
        assert call == {"name": tool, "arguments": want}, name


@pytest.mark.parametrize("name", sorted(FIELD))
def test_recorded_requests_are_the_harness_at_its_pin(name):
    a = get_adapter(_config(name))
    recs = _fixture(name)
    assert [r["call"] for r in recs] == list(range(len(recs)))
    assert {(r["harness"], r["version"]) for r in recs} == {(name, a.version)}
    chats = _chat_calls(name)
    assert len(chats) >= 2
    first = chats[0]["body"]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert FIELD[name][1] in [t["function"]["name"] for t in first["tools"]]
    # The shell step goes back to the model: an assistant tool call of that tool, then its result.
    back = next(c["body"]["messages"] for c in chats[1:] if c["body"].get("tools")
                and [m["role"] for m in c["body"]["messages"]][-2:] == ["assistant", "tool"])
    assert back[-2]["tool_calls"][0]["function"]["name"] == FIELD[name][1]
    assert all(r["headers"].get("authorization", "<redacted>") == "<redacted>" for r in recs)
    # Anything else it sent is an endpoint probe without a body (Hermes: model-info lookups).
    others = [(r["method"], r["path"]) for r in recs if (r["method"], r["path"]) != CHAT]
    assert all(r["body"] is None for r in recs if r["method"] == "GET")
    assert set(others) <= ({("GET", p) for p in ("/api/v1/models", "/api/tags", "/v1/props", "/props", "/version",
                                                    "/v1/models", "/v1/models/policy")}
                           | {("POST", "/api/show")}), others


@pytest.fixture()
def env():
    with tiny_dialect_env() as e:
        yield e


@pytest.mark.parametrize("name", sorted(FIELD))
def test_proxy_records_the_recorded_calls_token_exact_and_refuses_probes(env, name):
    import httpx

    sid, key = env.proxy.open_session({"harness": name})
    n0 = len(env.eng.calls)
    base = env.proxy.url + f"/s/{sid}"
    chats = 0
    for rec in _fixture(name):
        body = fill_placeholders(rec["body"], model="probe-model") if rec["body"] is not None else None
        if (rec["method"], rec["path"]) != CHAT:
            r = httpx.request(rec["method"], base + rec["path"], json=body,
                              headers={"Authorization": f"Bearer {key}"}, timeout=30)
            if rec["path"] == "/v1/models":  # the one the proxy serves: the model it was given
                assert r.status_code == 200 and "probe-model" in [m["id"] for m in r.json()["data"]], r.text
            else:  # 404, or 405 where a POST-only route has that shape (Gemini's /v1/models/<model>:...)
                assert r.status_code in (404, 405), (rec["path"], r.status_code, r.text)
            continue
        r = post(base + rec["path"], key, body)
        assert r.status_code == 200, r.text
        chats += 1
        events = sse_events(r.text) if body.get("stream") else None
        if events is not None:
            assert events[-1][1] == "[DONE]"
            assert json.loads(events[-2][1])["usage"]["prompt_tokens"] > 0  # include_usage honoured
    traj = env.proxy.trajectory(sid)
    assert len(traj.calls) == chats == len(_chat_calls(name))
    check_exact(traj, env.eng.calls[n0:])


# -- end to end: check-adapter in Docker with the real harnesses --------------------------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", sorted(FIELD))
def test_check_adapter_passes_inside_from_the_config_alone(name):
    from harnessrl.gym.tools.check_adapter import check_adapter

    docker_backend()
    adapter = get_adapter(_config(name))
    try:
        adapter.check_installed()
    except Exception as e:  # noqa: BLE001 - HarnessNotInstalled names the install command
        pytest.skip(str(e))
    report = check_adapter(_config(name), backend="docker", wall_time_s=480)
    checks = {c.name: c for c in report.checks}
    assert report.ok, {c.name: c.detail for c in report.checks if not c.ok}
    for label, want in (("gold", "1.0"), ("empty", "0.0")):
        assert checks[f"{label}: ends with a reason"].detail.startswith("submitted (ok)")
        assert checks[f"{label}: reward {want}"].detail.startswith(f"reward {want}, harness submitted")
    assert int(checks["gold: token-exact record"].detail.split()[0]) >= 2
    first = int(checks["first prompt fits the context"].detail.split()[2])
    assert 1000 < first < 8192
    python = FIELD[name][2]
    if python is not None:  # built for the sandbox's interpreter (or its python_runtime), stamped so
        from harnessrl.adapters.toolchain import installed_spec

        assert installed_spec("pip", adapter.install_dir[1]) == f"{FIELD[name][0][4:]} for python {python}"



# -- the real policy --------------------------------------------------------------------------
CAP = 16


@pytest.fixture(scope="module")
def real_stack():
    from adapter_helpers import real_model_stack

    yield from real_model_stack(CAP, "tiny-llama")


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.model
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", sorted(FIELD))
def test_real_policy_episode_ends_with_reason_and_complete_record(real_stack, name):
    """A sampling policy (tiny-llama: SmolLM2's tokenizer, template and context over 2 random
    layers) drives each harness one call: the episode ends with a reason and its record is whole
    and token-exact, whatever the harness makes of the policy's random text."""
    from adapter_helpers import builtin_task, check_sampled_episode

    from harnessrl.gym.episode import EpisodeConfig, run_episode

    adapter = get_adapter(_config(name))
    try:
        adapter.check_installed()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    handle, backend = real_stack
    res = run_episode(builtin_task(), adapter, lambda s, m: backend.create(s, mounts=m), handle, "policy",
                      EpisodeConfig(max_calls=1, wall_time_s=1200))
    check_sampled_episode(res, CAP)

def test_the_matrix_bench_lists_each_with_its_pin_and_python(monkeypatch):
    """bench/harness_matrix.py picks up every shipped config; Mistral Vibe's newest release is
    looked up for its python_runtime (none of its releases allows the bench's own 3.11)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "harness_matrix.py"
    spec = importlib.util.spec_from_file_location("harness_matrix", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    rows = {r.name: r for r in bench.harnesses(sorted(FIELD))}
    assert {n: (r.install, r.python, r.target) for n, r in rows.items()} == {
        n: (install, "3.13" if python == "3.13" else None, f"examples/harnesses/{n}.toml")
        for n, (install, _, python) in FIELD.items()}
