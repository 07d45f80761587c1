"""`VllmBackend` against the real local engine (tiny-llama), which also serves vLLM's token
routes (`/inference/v1/generate`, `/v1/completions` with token ids) on its one scheduler.

References are the engine's SGLang route through `EngineClient`: for the same prompt and
sampling, both vLLM routes give the same ids and logprobs. Also: finish reasons, streams
that concatenate to the whole, abort by closing the connection, vLLM-side aborts, 400s
naming the field, and the proxy generating through the backend (exact record, and a weight
update mid-generation resumed with per-token versions). No vLLM runs here.
"""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.backends import GenerationBackend, backend_class, make_backend
from harnessrl.gym.backends.vllm import VllmBackend
from harnessrl.gym.backends.engine_client import EngineClient, EngineError
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer
from harnessrl.trainers.engine import EngineServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import post

pytestmark = pytest.mark.timeout(300)
ROUTES = ["generate", "completions"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def engine():
    with EngineServer(model="tiny-llama") as server:
        yield server


def _prompts(tok, n: int) -> list[list[int]]:
    topics = ["a parser", "git bisect", "unit tests", "a race condition", "sorting"]
    return [tok.apply_chat_template([{"role": "user", "content": f"Explain {topics[i % 5]} " + "briefly, " * i}],
                                    add_generation_prompt=True, return_dict=False) for i in range(n)]


def _both(engine, route: str, prompt: list[int], **kw):
    """(SGLang route result, vLLM route result) for the same request."""
    async def go():
        async with EngineClient(engine.url) as s, VllmBackend(engine.url, route=route) as v:
            return await s.generate(prompt, **kw), await v.generate(prompt, **kw)
    return asyncio.run(go())


def _stream(backend_url: str, route: str, prompt: list[int], **kw):
    async def go():
        async with VllmBackend(backend_url, route=route) as v:
            return [c async for c in v.generate_stream(prompt, **kw)]
    return asyncio.run(go())


async def _until(pred, what: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ---- the contract ------------------------------------------------------------------------

def test_backend_fits_the_protocol_and_the_registry_names_it(engine):
    assert backend_class("vllm") is VllmBackend
    b = make_backend("vllm", engine.url, route="completions")
    assert isinstance(b, GenerationBackend) and b.path == "/v1/completions"
    assert isinstance(VllmBackend(engine.url), GenerationBackend)
    with pytest.raises(ValueError, match="route: 'chat' .* generate, completions"):
        VllmBackend(engine.url, route="chat")


@pytest.mark.parametrize("route", ROUTES)
def test_greedy_ids_and_logprobs_equal_the_sglang_route(engine, tok, route):
    for prompt in _prompts(tok, 3):
        s, v = _both(engine, route, prompt, max_new_tokens=24, temperature=0)
        assert len(v.output_ids) == 24 and v.output_ids == s.output_ids
        assert max(abs(a - b) for a, b in zip(v.logprobs, s.logprobs)) <= 1e-6
        assert (v.finish_reason, v.weight_version, v.prompt_tokens) == ("length", "default", len(prompt))


@pytest.mark.parametrize("route", ROUTES)
def test_seeded_filtered_sampling_equals_the_sglang_route(engine, tok, route):
    prompt = _prompts(tok, 1)[0]
    kw = dict(max_new_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=1234)
    s, v = _both(engine, route, prompt, **kw)
    assert v.output_ids == s.output_ids and len(v.output_ids) == 16
    assert max(abs(a - b) for a, b in zip(v.logprobs, s.logprobs)) <= 1e-6
    _, other = _both(engine, route, prompt, **dict(kw, seed=99))
    assert other.output_ids != v.output_ids  # the seed reaches the sampler


@pytest.mark.parametrize("route", ROUTES)
def test_stop_token_ends_with_stop(engine, tok, route):
    prompt = _prompts(tok, 2)[1]
    ref, _ = _both(engine, route, prompt, max_new_tokens=20, temperature=0)
    stop = ref.output_ids[6]
    first = ref.output_ids.index(stop)
    s, v = _both(engine, route, prompt, max_new_tokens=20, temperature=0, stop_token_ids=[stop])
    assert v.output_ids == s.output_ids == ref.output_ids[: first + 1]
    assert v.finish_reason == s.finish_reason == "stop"


@pytest.mark.parametrize("route", ROUTES)
def test_streamed_chunks_concatenate_to_the_whole(engine, tok, route):
    prompt = _prompts(tok, 2)[0]
    whole, _ = _both(engine, route, prompt, max_new_tokens=20, temperature=0)
    chunks = _stream(engine.url, route, prompt, max_new_tokens=20, temperature=0)
    assert [len(c.output_ids) for c in chunks] == [1] * 20  # one chunk per token, only the new ones
    assert [i for c in chunks for i in c.output_ids] == whole.output_ids
    lps = [x for c in chunks for x in c.logprobs]
    assert max(abs(a - b) for a, b in zip(lps, whole.logprobs)) <= 1e-6
    assert [c.finish_reason for c in chunks] == [""] * 19 + ["length"]
    stop = whole.output_ids[4]
    chunks = _stream(engine.url, route, prompt, max_new_tokens=20, temperature=0, stop_token_ids=[stop])
    assert [i for c in chunks for i in c.output_ids] == whole.output_ids[: whole.output_ids.index(stop) + 1]
    assert chunks[-1].finish_reason == "stop"


# ---- aborts ------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
def test_closing_the_connection_aborts_the_engine_request(engine, tok, route, stream):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with EngineClient(engine.url) as c, VllmBackend(engine.url, route=route) as v:
            kw = dict(max_new_tokens=5000, temperature=0)
            if stream:
                async def consume():
                    async for _ in v.generate_stream(prompt, **kw):
                        pass
                task = asyncio.create_task(consume())
            else:
                task = asyncio.create_task(v.generate(prompt, **kw))
            await _until(lambda: _running(c), "the request to be decoding")
            task.cancel()  # the proxy does this when its harness hangs up
            with pytest.raises(asyncio.CancelledError):
                await task
            await _until(lambda: _idle(c), "the engine to drop the abandoned request")
            return (await c.generate(prompt, max_new_tokens=4, temperature=0)).finish_reason

    assert asyncio.run(go()) == "length"  # and the engine goes on serving


async def _running(c: EngineClient) -> bool:
    return (await c.model_info())["running"] >= 1


async def _idle(c: EngineClient) -> bool:
    info = await c.model_info()
    return info["running"] == 0 and info["waiting"] == 0


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_side_abort_returns_the_partial_output_with_abort(engine, tok, route, stream):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with EngineClient(engine.url) as c, VllmBackend(engine.url, route=route) as v:
            kw = dict(max_new_tokens=5000, temperature=0, rid=f"ab-{route}-{stream}")
            if stream:
                async def consume():
                    return [ch async for ch in v.generate_stream(prompt, **kw)]
                task = asyncio.create_task(consume())
            else:
                task = asyncio.create_task(v.generate(prompt, **kw))
            await _until(lambda: _running(c), "the request to be decoding")
            await asyncio.sleep(0.2)
            await c.pause("abort")  # what a weight update does
            await c.resume()
            got = await task
            chunks = got if stream else [got]
            ids = [i for ch in chunks for i in ch.output_ids]
            ref = await c.generate(prompt, max_new_tokens=len(ids), temperature=0)
            return chunks, ids, ref.output_ids

    chunks, ids, ref = asyncio.run(go())
    assert chunks[-1].finish_reason == "abort" and {ch.finish_reason for ch in chunks[:-1]} <= {""}
    assert 1 <= len(ids) < 5000 and ids == ref
    assert all(len(ch.logprobs) == len(ch.output_ids) for ch in chunks)


# ---- bad input ---------------------------------------------------------------------------

SP = {"max_tokens": 4}
BAD = [
    ("generate", b"", "body"),
    ("generate", b"not json", "body"),
    ("generate", {"sampling_params": SP}, "token_ids"),
    ("generate", {"token_ids": [], "sampling_params": SP}, "token_ids"),
    ("generate", {"token_ids": [1, 2.5], "sampling_params": SP}, "token_ids[1]"),
    ("generate", {"token_ids": [1, 49152], "sampling_params": SP}, "token_ids[1]"),
    ("generate", {"token_ids": [1]}, "sampling_params"),
    ("generate", {"token_ids": [1], "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
    ("generate", {"token_ids": [1], "sampling_params": {"temperature": -1.0}}, "sampling_params.temperature"),
    ("generate", {"token_ids": [1], "sampling_params": {"top_p": 0.0}}, "sampling_params.top_p"),
    ("generate", {"token_ids": [1], "sampling_params": {"top_k": -2}}, "sampling_params.top_k"),
    ("generate", {"token_ids": [1], "sampling_params": {"temprature": 0}}, "sampling_params.temprature"),
    ("generate", {"token_ids": [1], "sampling_params": {"presence_penalty": 0.5}}, "sampling_params.presence_penalty"),
    ("generate", {"token_ids": [1], "sampling_params": {"n": 2}}, "sampling_params.n"),
    ("generate", {"token_ids": [1], "sampling_params": {"logprobs": 50}}, "sampling_params.logprobs"),
    ("generate", {"token_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}, "sampling_params.stop_token_ids"),
    ("generate", {"token_ids": [1], "sampling_params": SP, "stream": "yes"}, "stream"),
    ("generate", {"token_ids": [1], "sampling_params": SP, "prompt": [1]}, "prompt"),
    ("completions", {"prompt": "hello", "max_tokens": 4}, "prompt"),
    ("completions", {"prompt": ["hello", "there"]}, "prompt"),
    ("completions", {"prompt": [[1, 2], [3]]}, "prompt"),
    ("completions", {"prompt": [1, -1]}, "prompt[1]"),
    ("completions", {"prompt": [1, 49152]}, "prompt[1]"),
    ("completions", {"max_tokens": 4}, "prompt"),
    ("completions", {"prompt": [1], "max_tokens": "5"}, "max_tokens"),
    ("completions", {"prompt": [1], "echo": True}, "echo"),
    ("completions", {"prompt": [1], "seed": 1.5}, "seed"),
    ("completions", {"prompt": [1], "top_p": 2.0}, "top_p"),
    ("completions", {"prompt": [1], "stop_token_ids": [99999]}, "stop_token_ids"),
]


@pytest.mark.parametrize("route,body,field", BAD, ids=[f"{i}-{r}-{f}" for i, (r, _, f) in enumerate(BAD)])
def test_bad_input_gets_a_400_naming_the_field(engine, route, body, field):
    path = {"generate": "/inference/v1/generate", "completions": "/v1/completions"}[route]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(engine.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(f"{field}: ") and err["param"] == field and err["code"] == 400, err


@pytest.mark.parametrize("route", ROUTES)
def test_the_backend_raises_the_engines_message(engine, route):
    async def go():
        async with VllmBackend(engine.url, route=route) as v:
            return await v.generate([1, 49152], max_new_tokens=4)

    with pytest.raises(EngineError) as e:
        asyncio.run(go())
    name = "token_ids" if route == "generate" else "prompt"
    assert e.value.status_code == 400 and f"HTTP 400: {name}[1]: token id 49152 is outside the vocabulary" in str(e.value)


def test_health_and_model_info(engine):
    async def go():
        async with VllmBackend(engine.url) as v, VllmBackend("http://127.0.0.1:9") as dead:
            return await v.health(), await dead.health(), await v.model_info()

    up, down, info = asyncio.run(go())
    assert (up, down) == (True, False)
    assert info["model_path"] == "tiny-llama" and info["max_context_length"] == 8192
    assert info["logprob_space"] == "sampled"  # the local engine says so on /v1/models


def test_api_key_is_sent_and_a_refusal_is_a_clear_error(tok):
    prompt = _prompts(tok, 1)[0]

    async def go(url):
        async with VllmBackend(url, api_key="sk-v") as good, VllmBackend(url, route="completions") as bad:
            res = await good.generate(prompt, max_new_tokens=3, temperature=0)
            with pytest.raises(EngineError) as e:
                await bad.generate(prompt, max_new_tokens=3, temperature=0)
            return res, e.value

    with EngineServer(model="tiny-llama", api_key="sk-v") as server:
        res, err = asyncio.run(go(server.url))
    assert len(res.output_ids) == 3 and res.finish_reason == "length"
    assert err.status_code == 401 and "authorization: missing or wrong bearer token" in str(err)


class Stalled:
    """A real TCP server on loopback that reads each request and then answers nothing
    ("silent"), or the headers and one vLLM stream chunk and then nothing ("one_chunk"): an
    engine stopped with SIGSTOP mid-request; or ("full_backlog") never accepts: connecting hangs."""

    CHUNK = (b'data: {"choices": [{"index": 0, "text": "a", "token_ids": [7], "finish_reason": null, "logprobs": '
             b'{"content": [{"token": "token_id:7", "logprob": -0.5}], "token_logprobs": [-0.5]}}]}\n\n')

    def __init__(self, mode: str):
        import socket

        self.mode, self.conns, self.stop = mode, [], threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = None
        if mode == "full_backlog":
            self.sock.listen(0)
            self.conns.append(socket.create_connection(self.sock.getsockname()))  # takes the one slot
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
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                          + f"{len(self.CHUNK):x}\r\n".encode() + self.CHUNK + b"\r\n")

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("mode,stream,phase", [
    ("silent", False, "total"),  # a non-streamed reply comes whole: only the total bounds it
    ("silent", True, "first_byte"),
    ("one_chunk", True, "idle"),
    ("full_backlog", False, "connect"),
])
def test_engine_timeouts_bound_each_phase_as_for_sglang(route, mode, stream, phase):
    from harnessrl.gym.backends.engine_client import EngineTimeout, EngineTimeouts

    server = Stalled(mode)
    limits = EngineTimeouts(connect_s=0.5, first_byte_s=0.5, idle_s=0.5, total_s=30.0 if stream else 1.0)

    async def go():
        async with VllmBackend(server.url, route=route, model="m", timeouts=limits) as v:
            got = []
            t0 = time.monotonic()
            with pytest.raises(EngineTimeout) as e:
                if stream:
                    async for ch in v.generate_stream([1, 2], max_new_tokens=4):
                        got.append((ch.output_ids, ch.logprobs))
                else:
                    await v.generate([1, 2], max_new_tokens=4)
            return e.value, got, time.monotonic() - t0, await v.health()

    try:
        err, got, took, healthy = asyncio.run(go())
    finally:
        server.close()
    assert err.phase == phase and server.url in str(err) and isinstance(err, EngineError)
    assert got == ([([7], [-0.5])] if mode == "one_chunk" else []) and took < 10
    assert healthy is False


# ---- weight versions ---------------------------------------------------------------------

class StripVersion(httpx.AsyncBaseTransport):
    """Real HTTP to the engine, with the `weight_version` it adds removed from every body and
    stream chunk: what a real vLLM sends."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request):
        resp = await self.inner.handle_async_request(request)
        headers = [(k, v) for k, v in resp.headers.raw if k.lower() != b"content-length"]
        return httpx.Response(resp.status_code, headers=headers, stream=_Stripped(resp), extensions=resp.extensions)

    async def aclose(self):
        await self.inner.aclose()


class _Stripped(httpx.AsyncByteStream):
    def __init__(self, resp):
        self.resp = resp

    @staticmethod
    def _line(ln: bytes) -> bytes:
        s = ln.strip()
        prefix = b"data: " if s.startswith(b"data:") else b""
        data = s[5:].strip() if prefix else s
        if not data.startswith(b"{"):
            return ln
        obj = json.loads(data)
        obj.pop("weight_version", None)
        return prefix + json.dumps(obj).encode()

    async def __aiter__(self):
        buf = b""
        async for chunk in self.resp.aiter_raw():
            *lines, buf = (buf + chunk).split(b"\n")
            for ln in lines:
                yield self._line(ln) + b"\n"
        if buf:
            yield self._line(buf)

    async def aclose(self):
        await self.resp.aclose()


@pytest.mark.parametrize("route", ROUTES)
def test_without_a_reply_version_the_version_set_when_the_request_was_sent(engine, tok, route):
    prompt = _prompts(tok, 1)[0]

    async def go():
        async with VllmBackend(engine.url, route=route, transport=StripVersion()) as v, \
                EngineClient(engine.url) as c:
            first = await v.generate(prompt, max_new_tokens=3, temperature=0)
            v.set_weight_version(7)
            second = [ch.weight_version async for ch in v.generate_stream(prompt, max_new_tokens=3, temperature=0)]
            task = asyncio.create_task(v.generate(prompt, max_new_tokens=150, temperature=0))
            await _until(lambda: _running(c), "the request to be decoding")
            v.set_weight_version("8")  # set while it runs: it was sent under 7
            return first.weight_version, second, (await task).weight_version, v.weight_version

    assert asyncio.run(go()) == ("default", ["7", "7", "7"], "7", "8")


# ---- through the proxy -------------------------------------------------------------------

@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
def test_the_proxy_records_exactly_what_the_engine_samples(engine, tok, route, stream):
    cfg = ProxyConfig(engine_url=engine.url, backend="vllm", vllm_route=route, sampling_policy="honor", honor_seed=True,
                      engine_stream=stream)
    with ProxyServer(cfg, tokenizer=tok) as proxy:
        assert isinstance(proxy.core.engine, VllmBackend) and proxy.core.engine.route == route
        sid, key = proxy.open_session({})
        history = [{"role": "user", "content": "Write a haiku about tests."}]
        for temperature, seed in ((0.0, None), (1.0, 4321)):
            r = post(proxy.openai_base_url(sid) + "/chat/completions", key,
                     {"model": "policy", "messages": history, "max_tokens": 12, "temperature": temperature,
                      "seed": seed, "stream": stream})
            assert r.status_code == 200, r.text
            text = "".join(json.loads(ln[5:])["choices"][0]["delta"].get("content") or "" for ln in r.text.splitlines()
                           if ln.startswith("data: {") and json.loads(ln[5:])["choices"]) if stream \
                else r.json()["choices"][0]["message"]["content"]
            history += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
        t = proxy.trajectory(sid)
    t.validate()
    assert len(t.calls) == 2

    async def direct(c, prompt, temperature, seed):
        return await c.generate(prompt, max_new_tokens=12, temperature=temperature, seed=seed, stop_token_ids=[2])

    async def go():
        async with EngineClient(engine.url) as c:
            return [await direct(c, call.prompt_ids, t, s) for call, (t, s) in zip(t.calls, ((0.0, None), (1.0, 4321)))]

    for call, ref in zip(t.calls, asyncio.run(go())):
        assert call.completion_ids == ref.output_ids and len(ref.output_ids) > 0
        assert max(abs(a - b) for a, b in zip(call.logprobs, ref.logprobs)) <= 1e-6
    assert t.calls[1].flags["sampling"]["logprobs"] == "sampled"


def test_harnessrl_proxy_cli_serves_through_the_vllm_backend(engine, tok):
    """`harnessrl proxy --backend vllm --vllm-route completions` as its own process: the
    recorded completion is the engine's (each logprob is the engine's own for that token at
    T=1, read back from the SGLang route's prompt logprobs of prompt + completion)."""
    import subprocess

    from harnessrl.gym.proxy_admin import ProxyAdmin, ProxyHandle

    proc = subprocess.Popen([sys.executable, "-m", "harnessrl.cli", "proxy", "--engine-url", engine.url,
                             "--backend", "vllm", "--vllm-route", "completions"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        admin = ProxyAdmin(ProxyHandle(info["url"], info["admin_token"], engine_url=engine.url))
        sid, key = admin.open({})
        r = post(f"{info['url']}/s/{sid}/v1/chat/completions", key,
                 {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
        assert r.status_code == 200, r.text
        call = admin.trajectory(sid).calls[0]
        admin.close()
    finally:
        proc.terminate()
        proc.wait(30)
    assert len(call.completion_ids) >= 1 and call.flags["sampling"]["logprobs"] == "sampled"
    seq = call.prompt_ids + call.completion_ids
    body = httpx.post(engine.url + "/generate", timeout=120, json={
        "input_ids": seq, "return_logprob": True, "logprob_start_len": len(call.prompt_ids),
        "sampling_params": {"max_new_tokens": 0}}).json()
    want = [e[0] for e in body["meta_info"]["input_token_logprobs"]]
    assert [e[1] for e in body["meta_info"]["input_token_logprobs"]] == call.completion_ids
    assert call.logprobs == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("stream,reply_version", [(False, True), (True, False)],
                         ids=["reply-version", "set-weight-version"])
def test_weight_update_mid_generation_resumes_through_vllm(tok, stream, reply_version):
    """The SGLang path's interruption test (test_proxy_engine), through the vLLM backend: pause,
    abort, reload, resume; one reply whose tokens carry [old..., new...] versions. Without a
    version in the replies (a real vLLM), the trainer tells the backend (`set_weight_version`)."""
    from harnessrl.gym.models import resolve_model
    from harnessrl.trainers.weight_sync import DiskWeightSync

    cfg = dict(backend="vllm", sampling_policy="honor", honor_seed=True)
    with EngineServer(model="tiny-llama") as engine:
        backend = None if reply_version else VllmBackend(engine.url, transport=StripVersion())
        with ProxyServer(ProxyConfig(engine_url=engine.url, **cfg), tokenizer=tok, backend=backend) as proxy:
            sid, key = proxy.open_session({})
            out = {}
            body = {"model": "policy", "messages": [{"role": "user", "content": "Tell a long story."}],
                    "max_tokens": 1500, "temperature": 0, "stream": stream}
            th = threading.Thread(target=lambda: out.update(
                r=post(proxy.openai_base_url(sid) + "/chat/completions", key, body)))
            th.start()

            class Gate:  # the proxy, as the trainer's weight sync drives it
                calls: list[str] = []

                def pause(self):
                    self.calls.append("pause")
                    proxy.pause()

                def resume(self):
                    self.calls.append("resume")
                    if backend is not None:
                        backend.set_weight_version("1")
                    proxy.resume()

            async def update():
                async with EngineClient(engine.url) as c:
                    await _until(lambda: _running(c), "the call to be decoding")
                    await asyncio.sleep(0.1)
                    await DiskWeightSync(c, "unused", gate=Gate()).load(resolve_model("tiny-llama"), 1)

            asyncio.run(update())
            th.join(240)
            assert Gate.calls == ["pause", "resume"]
            assert out["r"].status_code == 200, out["r"].text
            c = proxy.trajectory(sid).calls[0]
        assert c.flags["interruptions"] == 1
        n, n0 = len(c.completion_ids), c.versions.count(0)
        assert 0 < n0 < n and c.versions == [0] * n0 + [1] * (n - n0)

        async def whole():
            async with EngineClient(engine.url) as e:
                return (await e.generate(c.prompt_ids, max_new_tokens=n, temperature=0, stop_token_ids=[2])).output_ids

        assert c.completion_ids == asyncio.run(whole())  # same weights reloaded: one uninterrupted generation


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_use_lora_makes_the_adapter_the_model_of_every_request(route):
    """vLLM selects a loaded adapter by the request's `model`: after `use_lora(name)` (what an
    adapter sync asks of the proxy inside its pause) every body names it, and None goes back
    to the served model."""
    async def bodies():
        async with VllmBackend("http://127.0.0.1:9", route=route, model="served") as v:
            args = ([1, 2, 3], 4, 1.0, 1.0, -1, None, None, None, None, False)
            before = await v._payload(*args)
            v.use_lora("policy")
            named = await v._payload(*args)
            v.use_lora(None)
            return before, named, await v._payload(*args)

    before, named, after = asyncio.run(bodies())
    assert (before["model"], named["model"], after["model"]) == ("served", "policy", "served")
