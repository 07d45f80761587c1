"""Issue 11's acceptance test for "the run owns the sampling", on real parts: the local engine
serving tiny-llama (float32) over HTTP, the proxy recording OpenAI Chat calls, and the real
TorchTrainer. A scripted harness sends temperature 0.7 (and top-p/top-k, and a different
temperature per call); the trainer recomputes every token's logprob under its call's
recorded parameters, and the mismatch against the engine's logprobs stays <= 1e-4. Greedy
records are refused; a record that misstates its distribution shows up in the mismatch."""
from __future__ import annotations

import re

import httpx
import pytest

from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()

torch = pytest.importorskip("torch")
from harnessrl.trainers.engine import EngineServer  # noqa: E402
from harnessrl.trainers.samples import RecordError  # noqa: E402
from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig  # noqa: E402

try:
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"tiny-llama not prepared: {e}", allow_module_level=True)

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
MAX = 8
#: per call of one episode: what the harness sends (honor: what is used)
MIXED = [{"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.8, "top_k": 50}, {"temperature": 1.3, "top_p": 0.95}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def engine():
    with EngineServer(model="tiny-llama", random_seed=7) as e:
        yield e


def trainer() -> TorchTrainer:
    """A fresh trainer at version 0, the engine's weights, float32 on CPU."""
    return TorchTrainer(TorchTrainerConfig(model="tiny-llama", device="cpu", dtype="float32", lr=1e-3))


def episode(proxy, task: str, reward: float, calls: list[dict], seed: int):
    """One scripted-harness session: len(calls) chat turns, each with its own sampling fields."""
    sid, key = proxy.open_session({"task_id": task, "harness": "scripted"})
    history = [{"role": "user", "content": "Fix the failing test, then say done."}]
    for i, fields in enumerate(calls):
        r = HTTP.post(f"{proxy.openai_base_url(sid)}/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "policy", "messages": history, "max_tokens": MAX, "seed": seed + i, **fields})
        assert r.status_code == 200, r.text
        history += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"observation {i}: 1 failed"}]
    proxy.set_reward(sid, reward, "ok", "submitted")
    proxy.close_session(sid)
    t = proxy.trajectory(sid)
    t.task_id = task
    return t


def group(proxy, calls, seed=0):
    return [episode(proxy, "T", r, calls, seed + 100 * n) for n, r in enumerate((1.0, 0.0))]


def direct(engine, prompt, n, temperature, top_p=1.0, top_k=-1, seed=None):
    sp = {"max_new_tokens": n, "temperature": temperature, "top_p": top_p, "top_k": top_k, "stop_token_ids": [2]}
    if seed is not None:
        sp["sampling_seed"] = seed
    r = HTTP.post(engine.url + "/generate", json={"input_ids": prompt, "sampling_params": sp, "return_logprob": True},
                   timeout=120).json()
    return [e[1] for e in r["meta_info"]["output_token_logprobs"]]


def n_sampled(batch) -> int:
    return sum(sum(seg.loss_mask) for t in batch for seg in t.segments)


def test_honored_mixed_sampling_trains_with_mismatch_under_1e_4(engine, tok):
    with ProxyServer(ProxyConfig(engine_url=engine.url, sampling_policy="honor", honor_seed=True), tokenizer=tok) as proxy:
        batch = group(proxy, MIXED)
    for t in batch:
        recs = [c.flags["sampling"] for c in t.calls]
        assert [(r["temperature"], r["top_p"], r["top_k"]) for r in recs] == [(0.7, 1.0, -1), (0.7, 0.8, 50),
                                                                             (1.3, 0.95, -1)]
        assert {r["logprobs"] for r in recs} == {"sampled"} and {r["policy"] for r in recs} == {"honor"}
        # generated at exactly those parameters: the engine asked directly, same seed, same ids
        for c, fields in zip(t.calls, MIXED):
            n = len(c.completion_ids)
            seed = c.index + (0 if t is batch[0] else 100)
            assert c.completion_ids == direct(engine, t.call_prompt(c), n, fields["temperature"],
                                              fields.get("top_p", 1.0), fields.get("top_k", -1), seed)
    m = trainer().step(batch)
    assert m.updated
    print(f"honor mixed: mismatch max {m.logprob_mismatch_max:.2e} mean {m.logprob_mismatch_mean:.2e} "
          f"over {m.mismatch_tokens} tokens")
    assert m.mismatch_tokens == n_sampled(batch) > 0
    assert m.logprob_mismatch_max <= 1e-4, m.logprob_mismatch_max


def test_the_run_overrides_a_greedy_harness_and_trains_with_mismatch_under_1e_4(engine, tok):
    run = dict(temperature=0.7, top_p=0.9, top_k=40)
    with ProxyServer(ProxyConfig(engine_url=engine.url, honor_seed=True, **run), tokenizer=tok) as proxy:
        batch = group(proxy, [{"temperature": 0}, {"temperature": 0, "top_p": 1.0}])  # aider-style greedy
    recs = [c.flags["sampling"] for t in batch for c in t.calls]
    assert {(r["policy"], r["temperature"], r["top_p"], r["top_k"], r["logprobs"]) for r in recs} == {
        ("run", 0.7, 0.9, 40, "sampled")}
    assert batch[0].calls[0].completion_ids != batch[1].calls[0].completion_ids  # the group members differ
    m = trainer().step(batch)
    assert m.mismatch_tokens == n_sampled(batch) and m.logprob_mismatch_max <= 1e-4, m.logprob_mismatch_max
    # the same data with its filters erased from the record: the mismatch metric sees it
    for t in batch:
        for c in t.calls:
            c.flags["sampling"].update(top_p=1.0, top_k=-1)
    wrong = trainer().step(batch)
    print(f"run 0.7/0.9/40: mismatch max {m.logprob_mismatch_max:.2e} over {m.mismatch_tokens} tokens; "
          f"filters erased from the record: mean {wrong.logprob_mismatch_mean:.2e}")
    assert wrong.logprob_mismatch_mean > 1e-2


def test_greedy_records_are_refused_naming_the_field(engine, tok):
    with ProxyServer(ProxyConfig(engine_url=engine.url, sampling_policy="honor", honor_seed=True), tokenizer=tok) as proxy:
        batch = group(proxy, [{"temperature": 0.7}, {"temperature": 0}])
    assert [c.flags["sampling"]["temperature"] for c in batch[0].calls] == [0.7, 0.0]
    with pytest.raises(RecordError, match=re.escape("field 'calls[1].flags.sampling.temperature': is 0: greedy")):
        trainer().step(batch)


def test_an_sglang_style_engine_is_recomputed_in_its_own_space(tok):
    # logprobs at the temperature before top-p/top-k, as SGLang reports them; the proxy asks
    # the engine which space it reports and records it, the trainer recomputes in that space
    with EngineServer(model="tiny-llama", random_seed=3, logprob_space="tempered") as e, \
            ProxyServer(ProxyConfig(engine_url=e.url, temperature=0.7, top_p=0.8, top_k=50, honor_seed=True), tokenizer=tok) as proxy:
        batch = group(proxy, [{}, {}])
    assert {c.flags["sampling"]["logprobs"] for t in batch for c in t.calls} == {"tempered"}
    m = trainer().step(batch)
    assert m.mismatch_tokens == n_sampled(batch) and m.logprob_mismatch_max <= 1e-4, m.logprob_mismatch_max
    for t in batch:  # misstating the space (as if filtered) is visible in the mismatch
        for c in t.calls:
            c.flags["sampling"]["logprobs"] = "sampled"
    wrong = trainer().step(batch)
    print(f"tempered engine: mismatch max {m.logprob_mismatch_max:.2e} over {m.mismatch_tokens} tokens; "
          f"space misstated: mean {wrong.logprob_mismatch_mean:.2e}")
    assert wrong.logprob_mismatch_mean > 1e-2
