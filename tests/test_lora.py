"""LoRA in the built-in trainer: peft adapters trained, checkpointed, and served by the local engine.

Real parts throughout: SmolLM2-135M (and tiny-llama where only the bookkeeping is under test),
the local engine on loopback, completions the engine sampled itself; the trainer's logprobs of
those completions, after a LoRA update and an adapter publish, must match the engine's.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from harnessrl.gym.backends.engine_client import EngineClient
from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model
from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers import lora
from harnessrl.trainers.engine import EngineServer
from harnessrl.trainers.lora import LoraConfig
from harnessrl.trainers.lora_sync import AdapterWeightSync, folder_bytes
from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

try:
    resolve_model("smollm2-135m")
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"models not prepared: {e}", allow_module_level=True)


def trainer(model: str, **kw) -> TorchTrainer:
    base = dict(model=model, device="cpu", lr=5e-3, seed=0, lora=LoraConfig(rank=8, alpha=16))
    base.update(kw)
    return TorchTrainer(TorchTrainerConfig(**base))


def prompt(tok, text: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False)


async def sampled_group(client: EngineClient, ids: list[int], task: str, n: int = 2, tokens: int = 12,
                        seed: int = 0) -> list[Trajectory]:
    """n completions the engine sampled (temperature 1), rewards 1, 0, 1, ... as one group."""
    out = []
    for i in range(n):
        r = await client.generate(ids, max_new_tokens=tokens, temperature=1.0, seed=seed + i)
        v = int(r.weight_version) if r.weight_version.isdigit() else 0
        seg = Segment(token_ids=ids + r.output_ids, loss_mask=[0] * len(ids) + [1] * len(r.output_ids),
                      logprobs=[0.0] * len(ids) + r.logprobs, versions=[-1] * len(ids) + [v] * len(r.output_ids))
        out.append(Trajectory(session_id=f"{task}-{seed}-{i}", task_id=task, reward=float(i % 2 == 0), status="ok",
                              segments=[seg]))
    return out


def test_adapter_publish_serves_the_trained_policy_within_1e4(tmp_path):
    """LoRA step -> adapter published and loaded -> the engine samples under the adapter, and the
    trainer scores those tokens within 1e-4 of the engine (float32); the adapter is megabytes."""
    tok = load_tokenizer("smollm2-135m")
    t = trainer("smollm2-135m")
    ids = [prompt(tok, "Write a haiku about tests."), prompt(tok, "Name a prime number.")]

    async def run():
        with EngineServer(model="smollm2-135m", weight_version="0") as engine:
            async with EngineClient(engine.url) as c:
                base0 = (await c.generate(ids[0], max_new_tokens=8, temperature=0)).logprobs
                batch = [x for k, p in enumerate(ids) for x in await sampled_group(c, p, f"t{k}")]
                first = t.step(batch)
                assert first.updated and first.logprob_mismatch_max < 1e-4  # adapter B = 0: the base model
                sync = AdapterWeightSync(c, tmp_path / "weights")
                assert await sync.push(t) == 1 and sync.last_mode == "adapter"
                info = await c.model_info()
                assert info["weight_version"] == "1"
                fresh = [x for k, p in enumerate(ids) for x in await sampled_group(c, p, f"t{k}", seed=10)]
                assert all(v == 1 for x in fresh for v, m in zip(x.segments[0].versions, x.segments[0].loss_mask) if m)
                second = t.step(fresh)
                # the adapter changed the policy (the engine's greedy logprobs moved) ...
                moved = (await c.generate(ids[0], max_new_tokens=8, temperature=0)).logprobs
                return first, second, sync, base0, moved

    first, second, sync, base0, moved = asyncio.run(run())
    assert max(abs(a - b) for a, b in zip(base0, moved)) > 1e-4  # ... so the match below is the adapter's
    assert second.mismatch_tokens > 0
    print(f"mismatch after the adapter publish: max {second.logprob_mismatch_max:.2e} over {second.mismatch_tokens}")
    assert second.logprob_mismatch_max <= 1e-4, second
    adapter = tmp_path / "weights" / "v1-lora"
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    assert not list(adapter.glob("model*.safetensors"))
    full = t.publish(tmp_path / "full")
    assert full == 2
    ratio = folder_bytes(adapter) / folder_bytes(tmp_path / "full")
    assert folder_bytes(adapter) < 20 << 20 and ratio < 0.05, (folder_bytes(adapter), ratio)


def test_merged_publish_when_adapters_are_off_matches_too(tmp_path):
    """adapters=False: the same policy as merged full weights through /update_weights_from_disk."""
    tok = load_tokenizer("tiny-llama")
    t = trainer("tiny-llama")
    ids = prompt(tok, "fix the bug")

    async def run():
        with EngineServer(model="tiny-llama", weight_version="0") as engine:
            async with EngineClient(engine.url) as c:
                t.step(await sampled_group(c, ids, "a", n=4))
                sync = AdapterWeightSync(c, tmp_path / "w", adapters=False)
                assert await sync.push(t) == 1 and sync.last_mode == "merged"
                assert (tmp_path / "w" / "v1" / "model.safetensors").is_file()
                return t.step(await sampled_group(c, ids, "a", n=4, seed=5))

    m = asyncio.run(run())
    assert m.mismatch_tokens > 0 and m.logprob_mismatch_max <= 1e-4


def test_engine_lora_routes_follow_sglang_and_vllm(tmp_path):
    """Load, replace, unload (base restored exactly), vLLM's in-place rule, and refusals that say why."""
    tok = load_tokenizer("tiny-llama")
    t = trainer("tiny-llama")
    with torch.no_grad():  # a non-zero adapter without training: B = 0 would change nothing
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    t.publish_adapter(tmp_path / "ad")
    ids = prompt(tok, "hello")

    async def run():
        with EngineServer(model="tiny-llama") as engine:
            async with EngineClient(engine.url) as c:
                greedy = lambda: c.generate(ids, max_new_tokens=6, temperature=0)  # noqa: E731
                base = await greedy()
                body = await c.load_lora_adapter("policy", str(tmp_path / "ad"))
                assert body["loaded_adapters"] == {"policy": str(tmp_path / "ad")}
                adapted = await greedy()
                await c.load_lora_adapter("policy", str(tmp_path / "ad"))  # replaces, never stacks
                again = await greedy()
                await c.unload_lora_adapter("policy")
                restored = await greedy()
                async with httpx.AsyncClient(base_url=engine.url) as h:
                    bad = await h.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
                    v1 = await h.post("/v1/load_lora_adapter", json={"lora_name": "p", "lora_path": str(tmp_path / "ad")})
                    v2 = await h.post("/v1/load_lora_adapter", json={"lora_name": "p", "lora_path": str(tmp_path / "ad")})
                    v3 = await h.post("/v1/load_lora_adapter",
                                      json={"lora_name": "p", "lora_path": str(tmp_path / "ad"), "load_inplace": True})
                    gone = await h.post("/v1/unload_lora_adapter", json={"lora_name": "nope"})
                    ver = await h.post("/update_weight_version", json={"new_version": "7"})
                return base, adapted, again, restored, bad, v1, v2, v3, gone, ver, (await c.model_info())

    base, adapted, again, restored, bad, v1, v2, v3, gone, ver, info = asyncio.run(run())
    diff = max(abs(a - b) for a, b in zip(base.logprobs, adapted.logprobs))
    assert diff > 1e-3  # the adapter is served
    assert again.logprobs == adapted.logprobs and restored.logprobs == base.logprobs
    assert bad.status_code == 400 and not bad.json()["success"] and "adapter_config.json" in bad.json()["error_message"]
    assert v1.status_code == 200 and "added successfully" in v1.text
    assert v2.status_code == 400 and "already been loaded" in v2.json()["error"]["message"]
    assert v3.status_code == 200
    assert gone.status_code == 404 and "'nope' is not loaded" in gone.json()["error"]["message"]
    assert ver.json()["success"] and info["weight_version"] == "7"


def test_unknown_target_module_is_refused_with_the_valid_names():
    with pytest.raises(ValueError) as e:
        trainer("tiny-llama", lora=LoraConfig(target_modules=["q_proj", "qkv_proj"]))
    msg = str(e.value)
    assert "'qkv_proj'" in msg and "valid: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in msg
    with pytest.raises(ValueError, match="either lora or trainable_layers"):
        TorchTrainerConfig(model="tiny-llama", lora=LoraConfig(), trainable_layers=1)


def test_only_the_adapter_trains_and_resume_gives_the_same_adapter(tmp_path):
    tok = load_tokenizer("tiny-llama")
    t = trainer("tiny-llama")
    base = {k: v.clone() for k, v in t.model.get_base_model().state_dict().items() if "lora_" not in k}
    ids = prompt(tok, "fix bug A")

    async def batches():
        with EngineServer(model="tiny-llama", weight_version="0") as engine:
            async with EngineClient(engine.url) as c:
                return [await sampled_group(c, ids, "A", n=4, seed=s) for s in (0, 10)]

    b1, b2 = asyncio.run(batches())
    for b in b2:  # trained as one step stale, the same in both runs
        b.segments[0].versions = [v if v < 0 else 0 for v in b.segments[0].versions]
    t.step(b1)
    after = t.model.get_base_model().state_dict()
    assert all(torch.equal(base[k], after[k]) for k in base)  # the base never moves
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in lora.adapter_state(t.model).items() if "lora_B" in k)
    t.save_checkpoint(tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / "state.pt", weights_only=True)
    assert all("lora_" in k for k in state["model"])  # the checkpoint holds the adapter, not the model
    t.step(b2)
    want = lora.adapter_state(t.model)

    r = trainer("tiny-llama", seed=123)  # another init: the checkpoint must overwrite it
    r.load_checkpoint(tmp_path / "ckpt")
    assert r.version == 1
    r.step(b2)
    got = lora.adapter_state(r.model)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_vllm_route_sync_loads_in_place_and_names_the_version(tmp_path):
    """api="vllm": /v1/load_lora_adapter with load_inplace on every push (the second would be
    refused without it), the version handed to `on_version` inside the pause."""
    tok = load_tokenizer("tiny-llama")
    t = trainer("tiny-llama")
    ids = prompt(tok, "fix the bug")
    seen = []

    async def run():
        with EngineServer(model="tiny-llama", weight_version="0") as engine:
            async with EngineClient(engine.url) as c:
                sync = AdapterWeightSync(c, tmp_path / "w", api="vllm", on_version=seen.append, keep=1)
                for _ in range(2):
                    t.step(await sampled_group(c, ids, "a", n=4, seed=len(seen)))
                    await sync.push(t)
                    await c.update_weight_version(str(t.version))  # vLLM names no version; the test's engine does
                assert sync.last_mode == "adapter" and sync.last_sync_bytes > 0
                return t.step(await sampled_group(c, ids, "a", n=4, seed=9))

    m = asyncio.run(run())
    assert seen == [1, 2] and m.logprob_mismatch_max <= 1e-4
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v2-lora"]  # keep=1 pruned v1


def test_after_an_adapter_sync_the_proxy_names_the_adapter_in_every_generation(tmp_path):
    """SGLang serves a loaded adapter only to /generate requests naming it (`lora_path`): the
    sync tells the proxy (its gate) inside the pause, and from then on every call the proxy
    makes names it. The local engine refuses a name it does not hold, so an adapter unloaded
    behind the proxy's back turns its next call into the engine's refusal, which shows the name
    was sent; unnamed again, the base weights serve it."""
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer

    tok = load_tokenizer("tiny-llama")
    t = trainer("tiny-llama")
    ids = prompt(tok, "Name a prime number.")

    def chat(proxy, seed: int) -> httpx.Response:
        sid, key = proxy.open_session({"task_id": "lora", "harness": "scripted"})
        return httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", timeout=120,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": "policy", "messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": 4, "temperature": 1.0, "seed": seed})

    async def run():
        with EngineServer(model="tiny-llama", weight_version="0") as engine, \
                ProxyServer(ProxyConfig(engine_url=engine.url, model="tiny-llama", honor_seed=True)) as proxy:
            async with EngineClient(engine.url) as c:
                assert (await asyncio.to_thread(chat, proxy, 1)).status_code == 200  # base: no name sent
                t.step(await sampled_group(c, ids, "t"))
                sync = AdapterWeightSync(c, tmp_path / "weights")
                sync.gate = proxy
                assert await sync.push(t) == 1 and sync.last_mode == "adapter"
                assert proxy.core.engine.lora_name == "policy"
                ok = await asyncio.to_thread(chat, proxy, 2)
                named = await c._http.post("/generate", json={"input_ids": ids, "lora_path": "policy",
                                                              "sampling_params": {"max_new_tokens": 2}})
                other = await c._http.post("/generate", json={"input_ids": ids, "lora_path": "other",
                                                              "sampling_params": {"max_new_tokens": 2}})
                await c.unload_lora_adapter("policy")
                orphaned = await asyncio.to_thread(chat, proxy, 3)
                assert proxy.use_lora(None)
                unnamed = await asyncio.to_thread(chat, proxy, 4)
                return ok, named, other, orphaned, unnamed

    ok, named, other, orphaned, unnamed = asyncio.run(run())
    assert ok.status_code == 200, ok.text
    assert named.status_code == 200, named.text
    assert other.status_code == 400 and "lora_path: adapter 'other' is not loaded (loaded: 'policy')" in other.text
    assert orphaned.status_code == 400, orphaned.text  # the engine's refusal, passed on
    assert "lora_path: adapter 'policy' is not loaded (loaded: none)" in orphaned.text
    assert unnamed.status_code == 200, unnamed.text
