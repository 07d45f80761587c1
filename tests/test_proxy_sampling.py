"""The run owns the sampling: what the engine is asked for and what the record says, over real
HTTP (proxy on loopback, a stand-in engine on loopback whose /generate bodies are captured)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, post, standin

SENT = {"temperature": 0.7, "top_p": 0.5}


class Captured:
    """ASGI wrapper that keeps every /generate request body the engine receives."""

    def __init__(self, app):
        self.app, self.bodies = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/generate":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def rcv():
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                self.bodies.append(json.loads(b"".join(chunks)))
            return m
        return await self.app(scope, rcv, send)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture
def env(tok, request):
    """(proxy, captured engine bodies); indirect parameters are ProxyConfig overrides."""
    eng, _ = standin(tok)
    cap = Captured(eng.app())
    overrides = request.param if hasattr(request, "param") else {}
    with ServedApp(cap) as e, ProxyServer(ProxyConfig(engine_url=e.url, **overrides), tokenizer=tok) as p:
        yield p, cap.bodies


def chat(proxy, body: dict, stream: bool = False) -> dict:
    sid, key = proxy.open_session({})
    r = post(proxy.openai_base_url(sid) + "/chat/completions", key,
             {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
              "stream": stream, **body})
    assert r.status_code == 200, r.text
    (call,) = proxy.trajectory(sid).calls
    return call.flags["sampling"]


def engine_sampling(bodies) -> tuple:
    sp = bodies[-1]["sampling_params"]
    return sp["temperature"], sp["top_p"], sp["top_k"]


@pytest.mark.parametrize("stream", [False, True])
def test_default_policy_samples_at_the_runs_parameters(env, stream):
    proxy, bodies = env
    rec = chat(proxy, SENT, stream)
    assert engine_sampling(bodies) == (1.0, 1.0, -1)
    assert rec == {"policy": "run", "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": "tempered",
                   "requested": {"temperature": 0.7, "top_p": 0.5, "top_k": None}}


@pytest.mark.parametrize("env", [dict(temperature=0.8, top_p=0.9, top_k=40)], indirect=True)
def test_a_greedy_harness_gets_the_runs_sampling(env):
    proxy, bodies = env
    rec = chat(proxy, {"temperature": 0, "top_p": 1.0})  # aider's greedy request
    assert engine_sampling(bodies) == (0.8, 0.9, 40)
    assert (rec["policy"], rec["temperature"], rec["top_p"], rec["top_k"]) == ("run", 0.8, 0.9, 40)
    assert rec["requested"] == {"temperature": 0, "top_p": 1.0, "top_k": None}


@pytest.mark.parametrize("env", [dict(sampling_policy="honor", temperature=0.9)], indirect=True)
@pytest.mark.parametrize("stream", [False, True])
def test_honor_uses_the_harness_values_and_the_run_for_the_rest(env, stream):
    proxy, bodies = env
    rec = chat(proxy, SENT, stream)
    assert engine_sampling(bodies) == (0.7, 0.5, -1)
    assert rec == {"policy": "honor", "temperature": 0.7, "top_p": 0.5, "top_k": -1, "logprobs": "tempered",
                   "requested": {"temperature": 0.7, "top_p": 0.5, "top_k": None}}
    rec = chat(proxy, {})  # nothing sent: the run's values
    assert engine_sampling(bodies) == (0.9, 1.0, -1) and rec["temperature"] == 0.9
    rec = chat(proxy, {"temperature": 0})  # greedy honoured, and recorded as greedy
    assert engine_sampling(bodies)[0] == 0.0 and rec["temperature"] == 0.0


def test_honor_falls_back_to_the_run_for_invalid_values():
    # (the dialects already answer out-of-range sampling fields with a 400; this is the policy's
    # own guard, so nothing invalid can ever reach the engine or the record)
    from harnessrl.gym.proxy.canonical import ChatRequest
    from harnessrl.gym.proxy.sampling import SamplingPolicy

    policy = SamplingPolicy(ProxyConfig(engine_url="", sampling_policy="honor", temperature=0.9, top_k=20))
    req = ChatRequest("openai_chat", "policy", [], temperature=-1, top_p=1.5, top_k=True)
    assert policy.effective(req) == ({"temperature": 0.9, "top_p": 1.0, "top_k": 20}, ["temperature", "top_p", "top_k"])
    req = ChatRequest("openai_chat", "policy", [], temperature=float("nan"), top_p=0.0, top_k="5")
    assert policy.effective(req)[1] == ["temperature", "top_p", "top_k"]
    rec = policy.record(req, {"temperature": 0.9, "top_p": 1.0, "top_k": 20}, "sampled", ["top_k"])
    assert rec["requested"]["top_k"] == "'5'" and rec["ignored"] == ["top_k"]
    # top_k 0 or -1 from a harness means "off"; >= 1 is used
    for k, expect in ((7, 7), (0, -1), (-1, -1)):
        assert policy.effective(ChatRequest("anthropic_messages", "policy", [], top_k=k))[0]["top_k"] == expect


@pytest.mark.parametrize("env", [dict(sampling_policy="honor")], indirect=True)
def test_honor_passes_anthropic_top_k(env):
    proxy, bodies = env
    sid, key = proxy.open_session({})
    for k, expect in ((7, 7), (0, -1)):
        r = post(proxy.anthropic_base_url(sid) + "/v1/messages", key,
                 {"model": "policy", "max_tokens": 4, "top_k": k, "messages": [{"role": "user", "content": "hi"}]},
                 headers={"x-api-key": key})
        assert r.status_code == 200, r.text
        assert engine_sampling(bodies)[2] == expect
        assert proxy.trajectory(sid).calls[-1].flags["sampling"]["top_k"] == expect


@pytest.mark.parametrize("env", [dict(engine_logprobs="sampled")], indirect=True)
def test_the_logprob_space_can_be_set_by_hand(env):
    proxy, _ = env
    assert chat(proxy, {})["logprobs"] == "sampled"


def test_a_zero_top_k_is_not_a_run_value():
    with pytest.raises(ValueError, match="top_k"):
        ProxyConfig(engine_url="http://127.0.0.1:1", top_k=0)
    with pytest.raises(ValueError, match="sampling_policy"):
        ProxyConfig(engine_url="http://127.0.0.1:1", sampling_policy="harness")


def test_the_logprob_space_probe_of_a_silent_engine_is_bounded():
    """An engine that accepts the connection and never answers (a stopped one) fails the
    probe with the first-byte timeout, like a generation would, instead of holding the call."""
    import asyncio
    import socket

    from harnessrl.gym.backends.engine_client import EngineClient, EngineTimeout, EngineTimeouts
    from harnessrl.gym.proxy.sampling import SamplingPolicy

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        async def probe():
            async with EngineClient(url, timeouts=EngineTimeouts(first_byte_s=0.2)) as client:
                return await SamplingPolicy(ProxyConfig(engine_url=url)).space(client)

        with pytest.raises(EngineTimeout, match="get_model_info") as e:
            asyncio.run(probe())
        assert e.value.phase == "first_byte"


def test_a_harness_seed_is_not_passed_on_by_default(env):
    # One fixed seed from a harness would make every member of a GRPO group sample the same tokens.
    proxy, bodies = env
    chat(proxy, {"seed": 42})
    chat(proxy, {"seed": 42})
    assert [b["sampling_params"].get("sampling_seed") for b in bodies[-2:]] == [None, None]


@pytest.mark.parametrize("env", [dict(honor_seed=True)], indirect=True)
def test_honor_seed_passes_the_harness_seed(env):
    proxy, bodies = env
    chat(proxy, {"seed": 42})
    assert bodies[-1]["sampling_params"]["sampling_seed"] == 42
