"""The generation-backend contract (gym/backends): the proxy generates through a handed-in
in-process callable that lives on another event loop (a trainer's server manager), with the
real local engine behind it; the record is exactly what the engine sampled, abort -> resume
sends prompt + tokens so far and keeps per-token versions, and a failing trainer side ends
the call with a recorded 503 while the proxy goes on serving."""
from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.backends import BACKENDS, backend_class
from harnessrl.gym.backends.inprocess import CallableBackend, TokenReply
from harnessrl.gym.backends.protocol import GenerationBackend, normalize_finish
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))
from proxy_helpers import post  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class TrainerLoop:
    """A trainer's own event loop in its own thread, holding an engine client bound to it."""

    def __init__(self, engine_url: str):
        from harnessrl.gym.backends.engine_client import EngineClient

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = asyncio.run_coroutine_threadsafe(self._make(EngineClient, engine_url), self.loop).result(10)
        self.seen: list[dict] = []

    @staticmethod
    async def _make(cls, url):
        return cls(url)

    def close(self):
        asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def engine():
    from harnessrl.trainers.engine import EngineServer

    with EngineServer(model="tiny-llama") as e:
        yield e


def _direct(engine, prompt, n):
    r = httpx.post(engine.url + "/generate", json={"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "stop_token_ids": [2]}}, timeout=300).json()
    lps = r["meta_info"]["output_token_logprobs"]
    return [e[1] for e in lps], [e[0] for e in lps]


def _chat(proxy, sid, key, text, max_tokens=10):
    return post(proxy.openai_base_url(sid) + "/chat/completions", key,
                {"model": "policy", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                 "temperature": 0})


def test_registry_names_and_errors():
    assert set(BACKENDS) == {"sglang", "vllm"}
    from harnessrl.gym.backends.engine_client import EngineClient

    assert backend_class("sglang") is EngineClient
    assert backend_class("harnessrl.gym.backends.inprocess:CallableBackend") is CallableBackend
    with pytest.raises(ValueError, match="known: sglang, vllm"):
        backend_class("tgi")
    assert isinstance(CallableBackend(lambda *a: None), GenerationBackend)
    assert [normalize_finish(r, 3, 8) for r in ("completed", "aborted", "length", None)] == \
        ["stop", "abort", "length", "stop"]
    assert normalize_finish(None, 8, 8) == "length"


def test_proxy_generates_on_the_trainers_loop_and_records_exact_ids(tok, engine):
    trainer = TrainerLoop(engine.url)
    threads = set()

    async def server_manager_generate(ids, params, rid):
        threads.add(threading.get_ident())
        trainer.seen.append({"input_ids": ids, "rid": rid, **params})
        res = await trainer.client.generate(ids, max_new_tokens=params["max_new_tokens"],
                                            temperature=params["temperature"], top_p=params["top_p"],
                                            top_k=params["top_k"], stop_token_ids=params.get("stop_token_ids"))
        return TokenReply(res.output_ids, res.logprobs, res.finish_reason, res.weight_version)

    backend = CallableBackend(server_manager_generate, name="trainer", loop=trainer.loop)
    cfg = ProxyConfig(engine_url="", sampling_policy="honor")
    try:
        with ProxyServer(cfg, tokenizer=tok, backend=backend) as proxy:
            sid, key = proxy.open_session({})
            for text in ("Write a haiku about tests.", "go on"):
                r = _chat(proxy, sid, key, text)
                assert r.status_code == 200, r.text
            t = proxy.trajectory(sid)
            t.validate()
            assert len(t.calls) == 2
            for c, seen in zip(t.calls, trainer.seen):
                assert seen["input_ids"] == c.prompt_ids and seen["temperature"] == 0.0
                ids, lps = _direct(engine, c.prompt_ids, 10)
                assert c.completion_ids == ids
                assert c.logprobs == pytest.approx(lps, abs=1e-5)
                assert set(c.versions) == {0}  # the engine's "default" weights
                assert c.flags["sampling"]["logprobs"] == "tempered"  # what a CallableBackend reports by default
        assert threads == {trainer.thread.ident}  # every generation ran on the trainer's loop
        assert backend.calls == 2
    finally:
        trainer.close()


def test_abort_resumes_with_prompt_plus_partial_and_keeps_per_token_versions(tok, engine):
    """The trainer side aborts the first request after 4 tokens (a weight update): the proxy
    resends prompt + those 4 with the remaining budget; the second part comes from version 7."""
    trainer = TrainerLoop(engine.url)

    async def gen(ids, params, rid):
        trainer.seen.append({"input_ids": ids, **params})
        first = len(trainer.seen) == 1
        n = 4 if first else params["max_new_tokens"]
        res = await trainer.client.generate(ids, max_new_tokens=n, temperature=0.0, stop_token_ids=[2])
        if first:
            return TokenReply(res.output_ids, res.logprobs, "aborted", 6)
        return TokenReply(res.output_ids, res.logprobs, "completed", None, versions=["7"] * len(res.output_ids))

    try:
        with ProxyServer(ProxyConfig(engine_url="", sampling_policy="honor"), tokenizer=tok,
                         backend=CallableBackend(gen, loop=trainer.loop, logprob_space="raw")) as proxy:
            sid, key = proxy.open_session({})
            r = _chat(proxy, sid, key, "Tell a long story about a lighthouse keeper.", max_tokens=12)
            assert r.status_code == 200, r.text
            c = proxy.trajectory(sid).calls[0]
        first, second = trainer.seen
        assert second["input_ids"] == first["input_ids"] + c.completion_ids[:4]
        assert second["max_new_tokens"] == first["max_new_tokens"] - 4 == 8
        assert c.flags["interruptions"] == 1
        assert c.flags["sampling"]["logprobs"] == "raw"  # the backend's space is recorded (vLLM's default)
        assert c.versions == [6] * 4 + [7] * (len(c.completion_ids) - 4)
        assert c.completion_ids == _direct(engine, c.prompt_ids, 12)[0]  # greedy: resume is seamless
    finally:
        trainer.close()


def test_failing_trainer_side_is_a_recorded_503_and_the_proxy_goes_on(tok, engine):
    trainer = TrainerLoop(engine.url)
    fail = {"on": True}

    async def gen(ids, params, rid):
        if fail["on"]:
            raise RuntimeError("replica 3 is gone")
        res = await trainer.client.generate(ids, max_new_tokens=params["max_new_tokens"], temperature=0.0)
        return TokenReply(res.output_ids, res.logprobs, res.finish_reason, res.weight_version)

    try:
        with ProxyServer(ProxyConfig(engine_url="", sampling_policy="honor"), tokenizer=tok,
                         backend=CallableBackend(gen, name="verl", loop=trainer.loop)) as proxy:
            sid, key = proxy.open_session({})
            r = _chat(proxy, sid, key, "hello")
            assert r.status_code == 503
            assert "inprocess:verl" in r.json()["error"]["message"] and "replica 3 is gone" in r.json()["error"]["message"]
            t = proxy.trajectory(sid)
            assert len(t.calls) == 1 and t.calls[0].detached and t.calls[0].flags["detached"] == "engine_error"
            assert t.segments == []  # recorded detached: in no segment, never trained
            fail["on"] = False
            r = _chat(proxy, sid, key, "hello")
            assert r.status_code == 200, r.text
            t = proxy.trajectory(sid)
            assert len(t.calls) == 2 and not t.calls[1].detached and len(t.segments) == 1
    finally:
        trainer.close()


@pytest.mark.parametrize("transport", ["httpx", "keepalive"])
def test_cancelling_a_streamed_sglang_call_frees_the_engine_request(tok, engine, transport):
    """The proxy cancels its engine call when the harness hangs up; the stream's reads run in
    the calling task, so the connection closes and the engine drops the request, every time."""
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.proxy.engine_http import make_engine_client

    prompt = tok.apply_chat_template([{"role": "user", "content": "Tell a very long story."}],
                                     add_generation_prompt=True, return_dict=False)

    async def info(c):
        return await c.model_info()

    async def go():
        async with EngineClient(engine.url) as probe:
            client = make_engine_client(engine.url) if transport == "keepalive" else EngineClient(engine.url)
            try:
                for _ in range(5):
                    async def consume():
                        async for _ in client.generate_stream(prompt, max_new_tokens=5000, temperature=0):
                            pass
                    task = asyncio.create_task(consume())
                    for _ in range(600):
                        if (await info(probe))["running"] >= 1:
                            break
                        await asyncio.sleep(0.02)
                    await asyncio.sleep(0.05)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await asyncio.wait_for(task, 20)  # a hung cancel would time out here
                    for _ in range(300):
                        i = await info(probe)
                        if i["running"] == 0 and i["waiting"] == 0:
                            break
                        await asyncio.sleep(0.05)
                    assert i["running"] == 0 and i["waiting"] == 0, i
            finally:
                await client.aclose()
            return (await probe.generate(prompt, max_new_tokens=3, temperature=0)).finish_reason

    assert asyncio.run(go()) == "length"
