"""The proxy's lean per-call path: /generate without httpx's client layer (same bytes on the
wire, same results as `EngineClient` over httpx), and prompts rendered on the event loop only
when they are light. Real tokenizer, real HTTP on loopback; no mocks."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harnessrl.gym.backends.engine_client import EngineClient, EngineError
from harnessrl.gym.doubles.standin import StandinEngine
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy.canonical import ChatRequest, Message
from harnessrl.gym.proxy.engine_http import LeanEngineClient, make_engine_client
from harnessrl.gym.proxy.recorder import INLINE_CHARS, Session, plan, plan_call
from harnessrl.gym.proxy.render import OverBudget, Renderer
from harnessrl.gym.proxy.toolcalls import HermesToolFormat
from harnessrl.gym.served import ServedApp

PROMPT = [1, 9038, 2, 198, 1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198]


@pytest.mark.parametrize("incremental", [False, True])
def test_lean_generate_gives_exactly_what_the_httpx_client_gives(incremental):
    eng = StandinEngine(weight_version="7", incremental=incremental)

    async def go(url):
        out = {}
        for name, client in (("httpx", EngineClient(url)), ("lean", make_engine_client(url))):
            async with client as c:
                plain = await c.generate(PROMPT, max_new_tokens=4, temperature=0.5, rid="r1", priority=3)
                chunks = [ch async for ch in c.generate_stream(PROMPT, max_new_tokens=16, seed=11)]
                out[name] = (plain, [(ch.output_ids, ch.logprobs, ch.finish_reason, ch.weight_version) for ch in chunks])
        return out

    with ServedApp(eng.app()) as served:
        got = asyncio.run(go(served.url))
    assert got["lean"] == got["httpx"]
    plain, chunks = got["lean"]
    ids = eng.calls[1]["output_ids"]  # the engine's own log: what it sampled for the first call
    assert plain.output_ids == ids[:4] and plain.finish_reason == "length" and plain.weight_version == "7"
    assert plain.logprobs == [-0.01 * (i + 1) for i in range(4)]
    assert [i for c in chunks for i in c[0]] == eng.calls[3]["output_ids"] and chunks[-1][2] == "stop"
    assert [c["input_ids"] for c in eng.calls] == [PROMPT] * 4 and [c.get("priority") for c in eng.calls] == [3, None] * 2


def test_lean_request_bytes_carry_the_payload_auth_and_adapter():
    seen: list[tuple[dict, dict]] = []

    async def generate(request: Request) -> Response:
        seen.append((json.loads(await request.body()), dict(request.headers)))
        meta = {"finish_reason": {"type": "stop"}, "weight_version": "3", "prompt_tokens": 3, "completion_tokens": 2,
                "output_token_logprobs": [[-0.5, 11, None], [-0.25, 2, None]]}
        return Response(json.dumps({"text": "", "meta_info": meta}), media_type="application/json")

    async def go(url):
        async with LeanEngineClient(url + "/", api_key="sk-engine") as c:
            c.use_lora("adapter-2")
            first = await c.generate([5, 6, 7], max_new_tokens=9, stop_token_ids=[2], seed=4)
            second = await c.generate([5, 6, 7, 11, 2], max_new_tokens=9)
            return first, second, len(c.transport._idle[c._key])

    with ServedApp(Starlette(routes=[Route("/generate", generate, methods=["POST"])])) as served:
        first, second, idle = asyncio.run(go(served.url))
    assert first.output_ids == second.output_ids == [11, 2] and first.logprobs == [-0.5, -0.25]
    assert first.finish_reason == "stop" and first.weight_version == "3"
    body, headers = seen[0]
    assert body == {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -1, "stream": False,
                    "lora_path": "adapter-2",
                    "sampling_params": {"max_new_tokens": 9, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                        "stop_token_ids": [2], "sampling_seed": 4}}
    assert headers["authorization"] == "Bearer sk-engine" and headers["content-type"] == "application/json"
    assert seen[1][0]["input_ids"] == [5, 6, 7, 11, 2]
    assert idle == 1  # both calls went over one kept-alive connection


def test_lean_engine_refusal_is_the_same_engine_error():
    eng = StandinEngine(max_context=5)

    async def go(url):
        errs = []
        for client in (EngineClient(url), make_engine_client(url)):
            async with client as c:
                with pytest.raises(EngineError) as e:
                    await c.generate(PROMPT, max_new_tokens=4)
                errs.append((e.value.status_code, str(e.value)))
        return errs

    with ServedApp(eng.app()) as served:
        httpx_err, lean_err = asyncio.run(go(served.url))
    assert lean_err == httpx_err
    assert lean_err[0] == 400 and "14 tokens do not fit the context length 5" in lean_err[1]


@pytest.fixture(scope="module")
def renderer():
    return Renderer(load_tokenizer("tiny-llama"), HermesToolFormat())


class WhereRendered(Renderer):
    """A renderer noting the thread each full render ran in."""

    def __init__(self, base: Renderer):
        self.__dict__.update(base.__dict__)
        self.threads: list[str] = []

    def full_prompt(self, messages, tools):
        self.threads.append(threading.current_thread().name)
        return super().full_prompt(messages, tools)


def test_a_light_plan_renders_on_the_loop_and_a_heavy_one_in_a_worker(renderer):
    r = WhereRendered(renderer)
    light = ChatRequest("openai-chat", "policy", [Message("system", "be brief"), Message("user", "list the files")])
    words = "".join(f"line {i}: value = compute(index, {i}) # fixme\n" for i in range(200))
    heavy = ChatRequest("openai-chat", "policy", [Message("system", "be brief"), Message("user", words)])
    assert len(words) > INLINE_CHARS

    async def go():
        loop_thread = threading.current_thread().name
        return loop_thread, await plan_call(Session.new({}), light, r), await plan_call(Session.new({}), heavy, r)

    loop_thread, pl_light, pl_heavy = asyncio.run(go())
    # the heavy plan was tried on the loop, refused before tokenizing, then made in a worker
    assert r.threads[:2] == [loop_thread, loop_thread] and len(r.threads) == 3
    assert r.threads[2].startswith("harnessrl-proxy-cpu_")
    assert pl_light.prompt_ids == renderer.full_prompt(light.messages, []) == plan(Session.new({}), light, renderer).prompt_ids
    assert pl_heavy.prompt_ids == renderer.full_prompt(heavy.messages, [])
    assert pl_light.split_reason is None and pl_light.prefix_len == 0


def test_the_budget_refuses_before_tokenizing_and_only_in_its_thread(renderer):
    text = "x = 1\n" * 600  # 3,600 characters, never seen before by this renderer's piece cache
    msgs = [Message("user", text)]
    with renderer.budget(1000):
        with pytest.raises(OverBudget, match="left"):
            renderer.full_prompt(msgs, [])
        assert text not in "".join(renderer._pieces)  # nothing of it was tokenized and cached
        other = []
        t = threading.Thread(target=lambda: other.append(renderer.full_prompt(msgs, [])))
        t.start()
        t.join()
    assert other[0] == renderer.full_prompt(msgs, []) and len(other[0]) > 600


def test_session_routes_front_only_model_calls_and_trust_no_forwarding_header():
    import httpx

    from harnessrl.gym.proxy import ProxyConfig, ProxyServer

    tok = load_tokenizer("tiny-llama")
    eng = StandinEngine()
    with ServedApp(eng.app()) as e, ProxyServer(ProxyConfig(engine_url=e.url, served_models=["policy"]), tokenizer=tok) as p:
        sid, key = p.open_session({"harness": "t"})
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        ok = httpx.post(f"{p.url}/s/{sid}/v1/chat/completions", json=body, headers=auth)
        wrong_method = httpx.get(f"{p.url}/s/{sid}/v1/chat/completions", headers=auth)
        deeper = httpx.post(f"{p.url}/s/{sid}/v1/chat/completions/x", json=body, headers=auth)
        no_sid = httpx.post(f"{p.url}/s//v1/chat/completions", json=body, headers=auth)
        unknown = httpx.post(f"{p.url}/s/0123/v1/messages", json=dict(body, max_tokens=5), headers=auth)
        # the admin API sees the connection's own address whatever a header claims
        admin = httpx.get(f"{p.url}/admin/stats", headers={"Authorization": f"Bearer {p.admin_token}",
                                                            "X-Forwarded-For": "203.0.113.7"})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == len(eng.calls[0]["output_ids"])
    assert [wrong_method.status_code, deeper.status_code, no_sid.status_code] == [405, 404, 404]
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert unknown.json()["type"] == "error"  # Anthropic's error shape, from the fast route
    assert admin.status_code == 200 and admin.json()["calls"] == 1


def test_a_streamed_call_whose_client_left_stops_its_generation_without_waiting_for_a_keepalive():
    """The SSE reply listens for the client's disconnect itself: with keep-alives 30 s apart
    and ~6 s of generation, only that listener can stop the engine request before it ends."""
    import time

    import httpx

    from harnessrl.gym.proxy import ProxyConfig, ProxyServer

    tok = load_tokenizer("tiny-llama")
    eng = StandinEngine(token_delay_s=1.0)
    cfg = ProxyConfig(engine_url="", keepalive_s=30.0, stream_grace_s=0.0)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({})
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream("POST", p.openai_base_url(sid) + "/chat/completions",
                              headers={"Authorization": f"Bearer {key}"}, timeout=httpx.Timeout(60, read=0.5),
                              json={"model": "policy", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
                chunks = r.iter_bytes()
                first = next(chunks)
                for _ in chunks:
                    pass
        deadline = time.monotonic() + 60
        while not p.trajectory(sid).calls:
            assert time.monotonic() < deadline, "the call was never recorded"
            time.sleep(0.05)
        t, stats = p.trajectory(sid), p.stats()
    assert first.startswith(b'data: {"id":"chatcmpl-') and b'"role":"assistant"' in first
    c = t.calls[0]
    assert c.detached and c.flags["undelivered"] == "client_disconnected" and c.completion_ids == []
    assert t.segments == [] and stats["undelivered"] == 1  # nothing generated reached the record: it stopped
