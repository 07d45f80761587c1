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

from harnessrl.gym.backends.engine_client import EngineClient, EngineError, GenerateResult
from harnessrl.gym.models import load_tokenizer
from harnessrl.trainers.engine import EngineServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def prompt():
    tok = load_tokenizer("tiny-llama")
    return tok.apply_chat_template([{"role": "user", "content": "List three sorting algorithms."}],
                                   add_generation_prompt=True, return_dict=False)


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
    # the stream hits the prefix cache (the first call's KV) and prefills only the last prompt
    # token: its logprobs agree to float32 rounding, not bit for bit (with HF's forward per step
    # too, for other prompts: "Say hello and count to three." differs at token 11)
    assert sum((ch.logprobs for ch in chunks), []) == pytest.approx(whole.logprobs, abs=1e-5)
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


# ---- timeouts against a server that stops answering ---------------------------------------

class Stalling:
    """A real TCP server on loopback that reads each request and then answers nothing
    ("silent"), or sends the headers and one stream chunk and then nothing ("one_chunk"),
    like an engine stopped with SIGSTOP mid-request; or ("full_backlog") never accepts, with
    its accept queue full, so that connecting hangs."""

    def __init__(self, mode: str):
        import threading

        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        if mode == "full_backlog":
            self.sock.listen(0)
            filler = socket.create_connection(self.sock.getsockname())  # takes the one queue slot
            self.conns.append(filler)
            self.thread = None
        else:
            self.sock.listen(16)
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)
            c.recv(65536)
            if self.mode == "one_chunk":
                chunk = b'data: {"text": "a", "output_ids": [7], "meta_info": {"finish_reason": null, ' \
                        b'"completion_tokens": 1, "output_token_logprobs": [[-0.5, 7, null]]}}\n\n'
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                          + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def _timeout_client(kind: str, url: str, timeouts) -> EngineClient:
    if kind == "proxy_transport":  # the proxy's own lean transport (gym.proxy.engine_http)
        from harnessrl.gym.proxy.engine_http import make_engine_client

        return make_engine_client(url, timeouts=timeouts)
    return EngineClient(url, timeouts=timeouts)


@pytest.mark.parametrize("kind", ["httpx", "proxy_transport"])
@pytest.mark.parametrize("mode,stream,phase", [
    ("silent", False, "total"),       # a non-streamed reply comes whole: only the total bounds it
    ("silent", True, "first_byte"),   # streamed: no first chunk
    ("one_chunk", True, "idle"),      # streamed: a chunk, then silence
    ("full_backlog", False, "connect"),
])
def test_generate_times_out_per_phase_against_a_server_that_stops_answering(kind, mode, stream, phase):
    from harnessrl.gym.backends.engine_client import EngineTimeout, EngineTimeouts

    server = Stalling(mode)
    limits = EngineTimeouts(connect_s=0.5, first_byte_s=0.5, idle_s=0.5, total_s=30.0 if stream else 1.0)

    async def go():
        async with _timeout_client(kind, server.url, limits) as c:
            got = []
            with pytest.raises(EngineTimeout) as e:
                if stream:
                    async for ch in c.generate_stream([1, 2], max_new_tokens=4):
                        got.append(ch.output_ids)
                else:
                    await c.generate([1, 2], max_new_tokens=4)
            healthy = await c.health()  # a stopped engine is not healthy (and does not hang the probe)
            return e.value, got, healthy

    try:
        err, got, healthy = asyncio.run(go())
    finally:
        server.close()
    assert err.phase == phase and server.url in str(err) and isinstance(err, EngineError)
    assert got == ([[7]] if mode == "one_chunk" else [])
    assert healthy is False


def test_the_total_bound_caps_a_stream_that_keeps_sending():
    """A stream whose chunks keep coming within the idle bound still ends at the total."""
    from harnessrl.gym.backends.engine_client import EngineTimeout, EngineTimeouts

    app = FastAPI()

    @app.post("/generate")
    async def generate(request: Request):
        async def chunks():
            for k in range(1, 10**6):
                await asyncio.sleep(0.05)
                meta = {"finish_reason": None, "completion_tokens": k,
                        "output_token_logprobs": [[-0.1, 5, None]] * k}
                yield f"data: {json.dumps({'text': None, 'meta_info': meta})}\n\n".encode()
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def go(url):
        async with EngineClient(url, timeouts=EngineTimeouts(first_byte_s=5, idle_s=5, total_s=1.0)) as c:
            n = 0
            with pytest.raises(EngineTimeout) as e:
                async for ch in c.generate_stream([1], max_new_tokens=10**6):
                    n += len(ch.output_ids)
            return e.value, n

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from proxy_helpers import ServedApp

    with ServedApp(app) as served:  # a real server: httpx's ASGI transport would buffer the stream
        err, n = asyncio.run(go(served.url))
    assert err.phase == "total" and n >= 1
