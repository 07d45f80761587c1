"""The local engine's prefix cache is exact: a cache hit gives the greedy ids and logprobs
(float32, within 1e-5) of a cold prefill by an engine without the cache, across a growing
multi-turn session, batch joins, aborts resumed with prompt + partial, retract/resume and
seeded group samples; and a weight update (or /flush_cache) never lets KV of the old
weights be served. The cached engine's single-row steps run in C, the cold one's in torch."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from harnessrl.gym.backends.engine_client import EngineClient
from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.trainers.engine import EngineServer
from harnessrl.trainers.engine.prefix_cache import PrefixCache

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()

pytestmark = pytest.mark.timeout(600)
TOL = 1e-5


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def engines():
    # hot decodes single rows whole in C (engine.cpu_matvec), cold with torch ops: every
    # comparison below also checks the C step against the Python one
    with EngineServer(model="tiny-llama", prefix_cache_mb=256, cpu_matvec="on") as hot, \
            EngineServer(model="tiny-llama", prefix_cache_mb=0, cpu_matvec="off") as cold:
        yield hot, cold


def _gen(url, ids, n, **sp):
    r = HTTP.post(url + "/generate", json={"input_ids": ids, "return_logprob": True, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, **sp}}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    lps = body["meta_info"]["output_token_logprobs"]
    return [e[1] for e in lps], [e[0] for e in lps], body["meta_info"]


def _stats(url):
    return HTTP.get(url + "/get_model_info", timeout=30).json()["prefix_cache"]


def _same(a, b):
    assert a[0] == b[0]
    assert a[1] == pytest.approx(b[1], abs=TOL)


def _session(tok, turns: int):
    msgs = [{"role": "system", "content": "You are a careful coding agent. " * 20}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Observation {t}: " + "ran the tests, 3 failed. " * 6})
        yield tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False), msgs


def test_growing_session_hits_and_equals_cold(engines, tok):
    hot, cold = engines
    before = _stats(hot.url)
    for i, (prompt, msgs) in enumerate(_session(tok, 5)):
        h, c = _gen(hot.url, prompt, 12), _gen(cold.url, prompt, 12)
        _same(h[:2], c[:2])
        if i > 0:  # everything up to this turn's new user message was cached by the turn before
            assert h[2]["cached_tokens"] > 0.6 * len(prompt), (h[2]["cached_tokens"], len(prompt))
        assert c[2]["cached_tokens"] == 0
        msgs.append({"role": "assistant", "content": tok.decode(h[0], skip_special_tokens=True)})
    after = _stats(hot.url)
    assert after["hits"] - before["hits"] >= 4 and after["hit_tokens"] > before["hit_tokens"]
    assert _stats(cold.url)["hits"] == 0
    assert hot.state.scheduler._fast.c_steps > 0 and cold.state.scheduler._fast.c_steps == 0


def test_hit_while_joining_a_running_batch_and_resume_after_abort(engines, tok):
    hot, cold = engines
    prompts = [p for p, _ in _session(tok, 3)]

    async def go():
        async with EngineClient(hot.url) as c:
            long = asyncio.create_task(c.generate(prompts[0], max_new_tokens=5000, temperature=0, rid="long"))
            for _ in range(600):  # until it decodes, then hit requests join its batch
                if (await c.model_info())["running"] >= 1:
                    break
                await asyncio.sleep(0.02)
            joined = await asyncio.gather(*(c.generate(p, max_new_tokens=10, temperature=0) for p in prompts[1:]))
            await c.abort("long")
            partial = await long
            # the proxy's resume: prompt + partial output, the rest of the budget
            resumed = await c.generate(prompts[0] + partial.output_ids, max_new_tokens=8, temperature=0)
            return joined, partial, resumed

    joined, partial, resumed = asyncio.run(go())
    for res, p in zip(joined, prompts[1:]):
        _same((res.output_ids, res.logprobs), _gen(cold.url, p, 10)[:2])
    assert partial.finish_reason == "abort" and len(partial.output_ids) >= 1
    n = len(partial.output_ids)
    whole = _gen(cold.url, prompts[0], n + 8)
    assert partial.output_ids == whole[0][:n]
    assert resumed.output_ids == whole[0][n:]
    assert resumed.logprobs == pytest.approx(whole[1][n:], abs=TOL)


def test_retract_resume_and_seeded_group_equal_cold(engines, tok):
    hot, cold = engines
    prompt = next(_session(tok, 1))[0]

    async def retract():
        async with EngineClient(hot.url) as c, httpx.AsyncClient(base_url=hot.url) as http:
            stream = c.generate_stream(prompt, max_new_tokens=60, temperature=0).__aiter__()
            ids = (await stream.__anext__()).output_ids
            await http.post("/pause_generation", json={"mode": "retract"})
            await c.resume()
            async for chunk in stream:
                ids += chunk.output_ids
            return ids

    assert asyncio.run(retract()) == _gen(cold.url, prompt, 60)[0]
    # a GRPO group: the same prompt, four seeds; later samples prefill one token
    for seed in range(4):
        sp = {"temperature": 1.0, "sampling_seed": 100 + seed}
        h, c = _gen(hot.url, prompt, 16, **sp), _gen(cold.url, prompt, 16, **sp)
        _same(h[:2], c[:2])
        assert h[2]["cached_tokens"] == len(prompt) - 1


def test_weight_update_and_flush_never_serve_old_kv(engines, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    hot, cold = engines
    prompt = next(_session(tok, 1))[0] + tok.encode(" weights", add_special_tokens=False)
    _gen(hot.url, prompt, 12)  # cached under the original weights
    perturbed = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-llama")), dtype=torch.float32)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in perturbed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    perturbed.save_pretrained(tmp_path / "v2")

    async def update(url, path, version):
        async with EngineClient(url) as c:
            await c.update_weights_from_disk(str(path), version)

    try:
        for url in (hot.url, cold.url):
            asyncio.run(update(url, tmp_path / "v2", "v2"))
        st = _stats(hot.url)
        assert st["entries"] == 0 and st["bytes"] == 0
        h, c = _gen(hot.url, prompt, 12), _gen(cold.url, prompt, 12)
        assert h[2]["cached_tokens"] == 0  # nothing of the old weights was reused
        _same(h[:2], c[:2])
        assert h[2]["weight_version"] == "v2"
        # /flush_cache drops entries of the current weights too
        assert _gen(hot.url, prompt, 4)[2]["cached_tokens"] > 0
        assert HTTP.post(hot.url + "/flush_cache", timeout=30).status_code == 200
        assert _stats(hot.url)["entries"] == 0 and _gen(hot.url, prompt, 4)[2]["cached_tokens"] == 0
    finally:
        for url in (hot.url, cold.url):
            asyncio.run(update(url, resolve_model("tiny-llama"), "restored"))


def test_prefix_cache_bounds_dedup_and_stale_epoch():
    def kv(n):
        return [(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4))]

    per_token = 2 * 2 * 4 * 4  # keys + values, 2 heads x 4 dims x 4 bytes
    c = PrefixCache(budget_bytes=10 * per_token)
    assert c.insert([1, 2, 3], kv(3), epoch=0)
    assert c.insert([1, 2, 3, 4, 5], kv(5), epoch=0)  # the shorter entry is its prefix: dropped
    assert len(c) == 1 and c.bytes == 5 * per_token
    assert not c.insert([1, 2], kv(2), epoch=0)  # already covered
    m, layers = c.match([1, 2, 3, 9])
    assert m == 3 and layers[0][0].shape[-2] == 3
    assert c.match([1, 2, 3, 4, 5])[0] == 4  # the last token is always prefilled
    assert c.match([7, 1, 2])[0] == 0
    assert c.insert([6, 6, 6, 6, 6, 6], kv(6), epoch=0)  # over budget: the LRU entry goes
    assert len(c) == 1 and c.match([1, 2, 3])[0] == 0 and c.stats["evictions"] == 1
    assert not c.insert([5] * 11, kv(11), epoch=0)  # larger than the whole budget
    c.invalidate()
    assert len(c) == 0 and not c.insert([1, 2, 3], kv(3), epoch=0)  # KV of an older epoch is refused
    with pytest.raises(ValueError, match="2 ids but KV of 3"):
        c.insert([1, 2], kv(3), epoch=c.epoch)


def test_the_proxy_records_hit_tokens_per_call(engines, tok):
    import sys
    from pathlib import Path

    from harnessrl.gym.proxy import ProxyConfig, ProxyServer

    sys.path.insert(0, str(Path(__file__).parent))
    from proxy_helpers import post

    hot, _ = engines
    with ProxyServer(ProxyConfig(engine_url=hot.url, sampling_policy="honor"), tokenizer=tok) as proxy:
        sid, key = proxy.open_session({})
        history = [{"role": "user", "content": "Plan a refactor of the parser module in three steps."}]
        for _ in range(2):
            r = post(proxy.openai_base_url(sid) + "/chat/completions", key,
                     {"model": "policy", "messages": history, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            history += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "go on"}]
        first, second = proxy.trajectory(sid).calls
    assert first.flags.get("cached_tokens", 0) < len(first.prompt_ids) // 2  # at most a shared template head
    # the second prompt starts with the first prompt + its completion, all cached by then
    assert second.flags["cached_tokens"] >= len(first.prompt_ids) + len(first.completion_ids) - 1
    assert second.flags["cached_tokens"] < len(second.prompt_ids)
