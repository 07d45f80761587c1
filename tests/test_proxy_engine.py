"""End to end against the real local CPU engine (tiny-llama): every dialect, streamed and
not, three turns; each recorded completion is exactly what the engine samples for the
recorded prompt (re-checked by asking the engine directly), and the trainer sample is the
last prompt + completion."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import post, sse_events

pytestmark = pytest.mark.timeout(300)
MAX = 12


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def stack(tok):
    from harnessrl.trainers.engine import EngineServer

    # "honor": these tests send their own temperature (0: greedy) and check the record against it
    with EngineServer(model="tiny-llama") as engine, \
            ProxyServer(ProxyConfig(engine_url=engine.url, sampling_policy="honor", honor_seed=True), tokenizer=tok) as proxy:
        yield engine, proxy


def _direct(engine, prompt: list[int], temperature: float, seed: int | None) -> tuple[list[int], list[float]]:
    sp = {"max_new_tokens": MAX, "temperature": temperature, "stop_token_ids": [2]}
    if seed is not None:
        sp["sampling_seed"] = seed
    r = httpx.post(engine.url + "/generate", json={"input_ids": prompt, "sampling_params": sp,
                                                   "return_logprob": True}, timeout=120).json()
    lps = r["meta_info"]["output_token_logprobs"]
    return [e[1] for e in lps], [e[0] for e in lps]


def _turn(proxy, sid, key, dialect: str, history: list, stream: bool, temperature: float, seed: int | None) -> str:
    """One call in `dialect`; returns the reply text and appends reply + a new turn to `history`."""
    if dialect == "chat":
        body = {"model": "policy", "messages": history, "max_tokens": MAX, "stream": stream,
                "temperature": temperature, "seed": seed}
        r = post(proxy.openai_base_url(sid) + "/chat/completions", key, body)
        assert r.status_code == 200, r.text
        if stream:
            text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                           for _, d in sse_events(r.text)[:-1] if json.loads(d)["choices"])
        else:
            text = r.json()["choices"][0]["message"]["content"]
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    elif dialect == "responses":
        body = {"model": "policy", "input": history, "max_output_tokens": MAX, "stream": stream,
                "temperature": temperature}
        r = post(proxy.openai_base_url(sid) + "/responses", key, body)
        assert r.status_code == 200, r.text
        if stream:
            out = json.loads(sse_events(r.text)[-1][1])["response"]["output"]
        else:
            out = r.json()["output"]
        text = out[0]["content"][0]["text"]
        history += [out[0], {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}]
    else:
        body = {"model": "policy", "system": "You are terse.", "messages": history, "max_tokens": MAX,
                "stream": stream, "temperature": temperature}
        r = post(proxy.anthropic_base_url(sid) + "/v1/messages", key, body, headers={"x-api-key": key})
        assert r.status_code == 200, r.text
        if stream:
            text = "".join(json.loads(d)["delta"]["text"] for e, d in sse_events(r.text)
                           if e == "content_block_delta")
        else:
            text = r.json()["content"][0]["text"]
        history += [{"role": "assistant", "content": [{"type": "text", "text": text}]},
                    {"role": "user", "content": "go on"}]
    return text


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_three_turns_record_what_the_engine_samples(stack, tok, dialect, stream):
    engine, proxy = stack
    sid, key = proxy.open_session({"harness": dialect})
    history = [{"role": "user", "content": "Write a haiku about tests."}]
    texts = [_turn(proxy, sid, key, dialect, history, stream, 0.0, None) for _ in range(3)]
    t = proxy.trajectory(sid)
    t.validate()
    assert len(t.segments) == 1 and len(t.calls) == 3
    seg = t.segments[0]
    for c, text in zip(t.calls, texts):
        ids, lps = _direct(engine, c.prompt_ids, 0.0, None)
        assert c.completion_ids == ids
        assert c.logprobs == pytest.approx(lps, abs=1e-4)
        assert tok.decode(c.completion_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == text
        assert seg.token_ids[:len(c.prompt_ids)] == c.prompt_ids
    last = t.calls[-1]
    assert seg.token_ids == last.prompt_ids + last.completion_ids
    assert sum(seg.loss_mask) == sum(len(c.completion_ids) for c in t.calls)
    assert set(seg.versions) - {-1} == {0}  # the engine's "default" weights


def test_seeded_sampling_is_recorded_exactly(stack):
    engine, proxy = stack
    sid, key = proxy.open_session({})
    history = [{"role": "user", "content": "Sample something."}]
    for turn in range(2):
        _turn(proxy, sid, key, "chat", history, False, 1.0, 1234 + turn)
    for turn, c in enumerate(proxy.trajectory(sid).calls):
        assert c.completion_ids == _direct(engine, c.prompt_ids, 1.0, 1234 + turn)[0]


def test_prompt_over_the_engine_context_is_a_clear_400_and_the_session_goes_on(stack):
    engine, proxy = stack
    sid, key = proxy.open_session({})
    url = proxy.openai_base_url(sid) + "/chat/completions"
    r = post(url, key, {"model": "policy", "messages": [{"role": "user", "content": "word " * 9000}], "max_tokens": 4})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    r = post(url, key, {"model": "policy", "messages": [{"role": "user", "content": "short"}], "max_tokens": 4})
    assert r.status_code == 200
    refused, good = proxy.trajectory(sid).calls  # the refusal is kept detached, with its numbers
    assert refused.flags["detached"] == "refused" and refused.completion_ids == [] and not good.detached
    assert refused.flags["prompt_tokens"] > 8192 and "8192" in refused.flags["refused"]


@pytest.mark.parametrize("stream", [False, True])
def test_weight_update_mid_generation_resumes_with_two_versions(tok, stream):
    """Issue 7 item 2 on the real engine: pause admission, abort, load new weights, resume;
    the harness gets one ordinary reply whose tokens carry the version that sampled them."""
    import asyncio
    import threading

    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.models import resolve_model
    from harnessrl.trainers.engine import EngineServer
    from harnessrl.trainers.weight_sync import DiskWeightSync

    with EngineServer(model="tiny-llama") as engine, \
            ProxyServer(ProxyConfig(engine_url=engine.url, sampling_policy="honor", honor_seed=True), tokenizer=tok) as proxy:
        sid, key = proxy.open_session({})
        out = {}
        body = {"model": "policy", "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 1500, "temperature": 0, "stream": stream}
        th = threading.Thread(target=lambda: out.update(
            r=post(proxy.openai_base_url(sid) + "/chat/completions", key, body)))
        th.start()

        async def update():
            async with EngineClient(engine.url) as c:
                for _ in range(600):  # until the call is decoding
                    if (await c.model_info()).get("running"):
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.1)
                # the trainer's sequence: proxy paused, engine paused + reloaded + continued, proxy resumed
                await DiskWeightSync(c, "unused", gate=Gate()).load(resolve_model("tiny-llama"), 1)

        class Gate:  # the proxy, logging what it was asked
            calls: list[str] = []

            def pause(self):
                self.calls.append("pause")
                proxy.pause()

            def resume(self):
                assert proxy.stats()["paused"]
                self.calls.append("resume")
                proxy.resume()

        asyncio.run(update())
        th.join(240)
        assert Gate.calls == ["pause", "resume"] and not proxy.stats()["paused"]
        assert out["r"].status_code == 200
        c = proxy.trajectory(sid).calls[0]
        assert c.flags["interruptions"] == 1
        n0 = c.versions.count(0)
        assert 0 < n0 < len(c.completion_ids) and c.versions == [0] * n0 + [1] * (len(c.completion_ids) - n0)
        # same weights reloaded: the resumed greedy output equals one uninterrupted generation
        assert c.completion_ids == _direct_n(engine, c.prompt_ids, len(c.completion_ids))


def _direct_n(engine, prompt, n):
    r = httpx.post(engine.url + "/generate", json={"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "stop_token_ids": [2]}}, timeout=300).json()
    return [e[1] for e in r["meta_info"]["output_token_logprobs"]]
