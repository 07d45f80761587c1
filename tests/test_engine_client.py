"""EngineClient against the local engine over loopback, and against SGLang-shaped replies.

The second part serves the reply shapes real SGLang sends (no `output_ids` in some modes,
cumulative stream chunks with `text: null`, an abort answered as an error status by some
versions) from a small ASGI app through the client's `transport` parameter.
"""
from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from harnessrl.gym.engine_client import EngineClient, EngineError, GenerateResult
from harnessrl.gym.models import load_tokenizer
from harnessrl.trainers.engine import EngineServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def prompt():
    tok = load_tokenizer("tiny-llama")
    return tok.apply_chat_template([{"role": "user", "content": "List three sorting algorithms."}],
                                   add_generation_prompt=True)


@pytest.fixture(scope="module")
def engine():
    """Incremental streaming and an API key: the options the other test file leaves at default."""
    with EngineServer(model="tiny-llama", incremental_streaming_output=True, api_key="sk-local") as server:
        yield server


def test_client_round_trip_on_an_incremental_stream(engine, prompt):
    async def go():
        async with EngineClient(engine.url, api_key="sk-local") as c:
            assert await c.health() is True
            info = await c.model_info()
            whole = await c.generate(prompt, max_new_tokens=15, temperature=0)
            chunks = [ch async for ch in c.generate_stream(prompt, max_new_tokens=15, temperature=0)]
            await c.flush_cache()
            await c.pause("in_place")
            await c.resume()
            return info, whole, chunks

    info, whole, chunks = asyncio.run(go())
    assert info["is_generation"] is True and info["weight_version"] == "default"
    assert whole.finish_reason == "length" and len(whole.output_ids) == 15 == len(whole.logprobs)
    assert whole.prompt_tokens == len(prompt) and whole.weight_version == "default"
    assert [len(ch.output_ids) for ch in chunks] == [1] * 15
    assert sum((ch.output_ids for ch in chunks), []) == whole.output_ids
    assert sum((ch.logprobs for ch in chunks), []) == whole.logprobs
    assert "".join(ch.text for ch in chunks) == whole.text
    assert [ch.finish_reason for ch in chunks] == [""] * 14 + ["length"]


def test_client_errors_name_the_url_and_the_reason(engine, prompt):
    async def go():
        out = {}
        async with EngineClient(engine.url) as no_key:
            with pytest.raises(EngineError) as e:
                await no_key.generate(prompt, max_new_tokens=2)
            out["auth"] = e.value
        async with EngineClient(engine.url, api_key="sk-local") as c:
            with pytest.raises(EngineError) as e:
                await c.generate([1, 10**6], max_new_tokens=2)
            out["bad"] = e.value
            with pytest.raises(EngineError) as e:
                await c.update_weights_from_disk("/nonexistent/folder", "v9")
            out["weights"] = e.value
            with pytest.raises(ValueError):
                await c.abort()
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        async with EngineClient(dead, timeout=5) as c:
            out["health"] = await c.health()
            with pytest.raises(EngineError) as e:
                await c.generate([1, 2], max_new_tokens=2)
            out["dead"] = e.value
            with pytest.raises(EngineError):
                async for _ in c.generate_stream([1, 2], max_new_tokens=2):
                    pass
        return out, dead

    out, dead = asyncio.run(go())
    assert out["auth"].status_code == 401 and engine.url in str(out["auth"])
    assert out["bad"].status_code == 400 and "input_ids[1]" in str(out["bad"])
    assert "/nonexistent/folder" in str(out["weights"])
    assert out["health"] is False
    assert dead in str(out["dead"]) and "unreachable" in str(out["dead"])


# ---- SGLang reply shapes ----------------------------------------------------------------

class SGLangShapes:
    """An ASGI app that answers /generate the way SGLang does, recording each request body."""

    def __init__(self, abort_as_error: bool = False):
        self.bodies: list[dict] = []
        self.abort_as_error = abort_as_error
        self.app = FastAPI()
        self.app.post("/generate")(self.generate)

    @staticmethod
    def _meta(ids, finish, n_prompt):
        return {"id": "r1", "finish_reason": finish, "prompt_tokens": n_prompt, "completion_tokens": len(ids),
                "cached_tokens": 0, "weight_version": "step-7",
                "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(ids)]}

    async def generate(self, request: Request):
        body = await request.json()
        self.bodies.append(body)
        n = len(body["input_ids"])
        ids = [11, 12, 13, 2]
        if self.abort_as_error:
            return JSONResponse({"error": {"message": "Request aborted by scheduler."}}, status_code=400)
        if not body.get("stream"):
            # no output_ids: the client must read ids from output_token_logprobs
            return {"text": "abc", "meta_info": self._meta(ids, {"type": "stop", "matched": 2}, n)}

        async def chunks():
            for k in range(1, len(ids) + 1):  # cumulative, as SGLang's default stream is
                finish = {"type": "stop", "matched": 2} if k == len(ids) else None
                chunk = {"text": "abc" if finish else None, "output_ids": ids[:k],
                         "meta_info": self._meta(ids[:k], finish, n)}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")


def _client(fake: SGLangShapes) -> EngineClient:
    return EngineClient("http://sglang.test", transport=httpx.ASGITransport(app=fake.app))


def test_reads_sglang_replies_without_output_ids_and_sends_sglang_fields():
    fake = SGLangShapes()

    async def go():
        async with _client(fake) as c:
            res = await c.generate([5, 6, 7], max_new_tokens=9, temperature=0.6, top_p=0.9, top_k=40,
                                   stop_token_ids=[2], rid="abc", seed=3)
            chunks = [ch async for ch in c.generate_stream([5, 6, 7], max_new_tokens=9)]
            return res, chunks

    res, chunks = asyncio.run(go())
    assert res == GenerateResult([11, 12, 13, 2], [-0.5, -1.5, -2.5, -3.5], "stop", "step-7", 3, "abc")
    assert [ch.output_ids for ch in chunks] == [[11], [12], [13], [2]]
    assert [ch.logprobs for ch in chunks] == [[-0.5], [-1.5], [-2.5], [-3.5]]
    assert [ch.finish_reason for ch in chunks] == ["", "", "", "stop"] and chunks[-1].text == "abc"
    sent = fake.bodies[0]
    assert sent["input_ids"] == [5, 6, 7] and sent["rid"] == "abc" and sent["return_logprob"] is True
    assert sent["sampling_params"] == {"max_new_tokens": 9, "temperature": 0.6, "top_p": 0.9, "top_k": 40,
                                       "stop_token_ids": [2], "sampling_seed": 3}
    assert fake.bodies[1]["stream"] is True


def test_an_abort_answered_as_an_error_status_is_an_abort_result():
    async def go():
        async with _client(SGLangShapes(abort_as_error=True)) as c:
            return await c.generate([5, 6], max_new_tokens=4)

    res = asyncio.run(go())
    assert res.finish_reason == "abort" and res.output_ids == [] and res.prompt_tokens == 2
