"""The Tinker bridge (trainers/bridges/tinker.py) end to end against a real Tinker service.

The service is SkyRL's open-source Tinker server (`skyrl.tinker.api`, JAX backend on CPU)
serving tiny-llama, started by `trainers.bridges.tinker_server.TinkerServer`; the client is
the real `tinker` SDK. The proxy samples through `TinkerBackend` (real HTTP on loopback,
OpenAI Chat, the real tokenizer); the environment is scripted: each episode is one chat
call and the first member of each GRPO pair is rewarded 1, the second 0. Two trainer steps
(importance_sampling, LoRA rank 4): each one publishes a new sampling client, which the
proxy's next calls use and record as the new version, and the policy's logprobs of a fixed
sequence move.

Needs (else skipped, with the reason): SkyRL >= 0.4.0 with its JAX extra importable by the
server, and a tinker SDK that speaks its protocol (0.25.x; see tinker_server.py) for the
bridge. scripts/setup.sh unpacks both into .venv/share/harnessrl/ (HARNESSRL_SKYRL_TINKER_PATH
and HARNESSRL_TINKER_CLIENT_PATH override). .venv's own tinker is 0.38 (hosted Tinker), so
there the end-to-end test reruns itself in a child pytest with the 0.25 client first on
PYTHONPATH, and passes, skips or fails as the child did.

The fast tests pin the Datum layout, the normalization and the sampling refusal exactly.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers.samples import RecordError, Sample

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is in the `bridges` extra")
from harnessrl.trainers.bridges.tinker import (  # noqa: E402
    TinkerTrainer, TinkerTrainerConfig, build_datums, check_raw_sampling, datum_inputs, token_scales)
from harnessrl.trainers.bridges.tinker_server import server_pythonpath, tinker_client_path  # noqa: E402

_CHILD = "HARNESSRL_TINKER_E2E_CHILD"  # set in the child pytest that has the 0.25 client


def _sample(sid="a", adv=0.5, weight=1.0, temperature=1.0, top_p=1.0, top_k=-1) -> Sample:
    #          prompt   sampled   tool  sampled
    toks = [1, 10, 11, 20, 21, 30, 40]
    mask = [0, 0, 0, 1, 1, 0, 1]
    lps = [0.0, 0.0, 0.0, -0.5, -1.5, 0.0, -2.0]
    vers = [-1, -1, -1, 0, 0, -1, 0]
    t = [temperature if m else 1.0 for m in mask]
    return Sample(toks, mask, lps, vers, adv, weight, sid, 0, "task", t, [top_p if m else 1.0 for m in mask],
                  [top_k if m else -1 for m in mask])


def test_datum_inputs_are_the_shifted_sequence_with_zeros_off_the_sampled_tokens():
    d = datum_inputs(_sample(), 0.25)
    assert d == {"target_tokens": [10, 11, 20, 21, 30, 40],
                 "logprobs": [0.0, 0.0, -0.5, -1.5, 0.0, -2.0],
                 "advantages": [0.0, 0.0, 0.125, 0.125, 0.0, 0.125]}
    (datum,) = build_datums([_sample()], "token")
    assert datum.model_input.to_ints() == [1, 10, 11, 20, 21, 30]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [10, 11, 20, 21, 30, 40]
    assert datum.loss_fn_inputs["advantages"].tolist() == pytest.approx([0, 0, 0.5 / 3, 0.5 / 3, 0, 0.5 / 3])


def test_normalization_scales():
    a, b = _sample("a", weight=1.0), _sample("b", weight=0.25)
    assert token_scales([a, b], "token") == [1 / 6, 1 / 6]  # 3 + 3 sampled tokens, each counts once
    # sequence: weight / sampled tokens / trajectories
    assert token_scales([a, b], "sequence") == [1.0 / 3 / 2, 0.25 / 3 / 2]


def test_tokens_not_sampled_from_the_raw_model_are_refused():
    check_raw_sampling([_sample()])
    for kw, shown in (({"temperature": 0.7}, "temperature 0.7, top_p 1, top_k -1"),
                      ({"top_p": 0.9}, "top_p 0.9"), ({"top_k": 50}, "top_k 50")):
        with pytest.raises(RecordError, match=rf"trajectory 'a' segment 0 field 'calls.flags.sampling': token \[3\] "
                                              rf"was sampled at .*{shown}"):
            check_raw_sampling([_sample(**kw)])


def test_config_names_bad_fields():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="loss_fn"):
        TinkerTrainerConfig(loss_fn="dro_typo")
    with pytest.raises(ValidationError, match="lora_rank"):
        TinkerTrainerConfig(lora_rank=0)
    with pytest.raises(ValidationError, match="extra_forbidden"):
        TinkerTrainerConfig(learning_rate=1e-3)


# -- end to end against SkyRL's Tinker server ---------------------------------------------------
def _speaks_skyrl() -> bool:
    return tuple(int(x) for x in tinker.__version__.split(".")[:2]) < (0, 26)


def _in_child_with_the_client(request, tmp_path) -> None:
    """Run this test again in a child pytest whose `tinker` is the unpacked 0.25 client; its
    outcome (pass, skip with its reason, fail with its output) becomes this test's."""
    client = tinker_client_path()
    if client is None or os.environ.get(_CHILD):
        where = f"the one on PYTHONPATH ({client}) is not 0.25" if client else "none is unpacked"
        pytest.skip(f"tinker {tinker.__version__}: SkyRL's Tinker server (0.4.0) speaks the protocol of tinker < 0.26 "
                    f"(tinker >= 0.30 requires sample_sequence_ids in asample promises); {where} "
                    "(scripts/setup.sh unpacks tinker 0.25.0 into .venv; or set HARNESSRL_TINKER_CLIENT_PATH)")
    report = tmp_path / "child.xml"
    env = dict(os.environ, **{_CHILD: "1"},
               PYTHONPATH=os.pathsep.join(p for p in (client, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-n", "0", "-p", "no:cacheprovider", f"--junitxml={report}",
                        f"--basetemp={tmp_path / 'child'}", f"{__file__}::{request.node.name}"],
                       cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=2300)
    out = (r.stdout + r.stderr)[-6000:]
    print(out)
    case = next(ET.parse(report).getroot().iter("testcase"), None) if report.exists() else None
    if r.returncode != 0 or case is None or case.find("failure") is not None or case.find("error") is not None:
        pytest.fail(f"the child pytest with tinker from {client} failed (exit {r.returncode}):\n{out}")
    if (skipped := case.find("skipped")) is not None:
        pytest.skip(f"in the child pytest with tinker from {client}: {skipped.get('message')}")


def _server_ready() -> str | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (server_pythonpath(), os.environ.get("PYTHONPATH")) if p))
    probe = "import skyrl.tinker.api, skyrl.tinker.proto_serialization, skyrl.backends.jax"
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return ("SkyRL >= 0.4.0 with its jax extra is not importable for the server (scripts/setup.sh "
                f"unpacks SkyRL 0.4.0 into .venv; or set HARNESSRL_SKYRL_TINKER_PATH): {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return None


def _chat(proxy, seed: int, text: str = "Say anything.") -> str:
    sid, key = proxy.open_session({"task_id": "pair", "harness": "scripted"})
    r = httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", timeout=600,
                   headers={"Authorization": f"Bearer {key}"},
                   json={"model": "policy", "messages": [{"role": "user", "content": text}],
                         "max_tokens": 4, "temperature": 1.0, "seed": seed})
    assert r.status_code == 200, r.text
    return sid


def _probe(client, prompt: list[int], seed: int):
    from tinker import types

    resp = client.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0, seed=seed, stop=[2])).result()
    return resp.sequences[0].tokens, resp.sequences[0].logprobs


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_tinker_steps_through_the_proxy_move_the_policy_and_bump_the_version(tmp_path, monkeypatch, request):
    if not _speaks_skyrl():
        _in_child_with_the_client(request, tmp_path)
        return
    reason = _server_ready()
    if reason:
        pytest.skip(reason)
    from harnessrl.gym.models import load_tokenizer, resolve_model
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.trainers.bridges.tinker_server import TinkerServer

    monkeypatch.setenv("TINKER_API_KEY", "tml-local-skyrl")  # SkyRL checks none; the SDK wants the prefix
    model = "tiny-llama"  # the name the service serves, loaded from the prepared folder
    with TinkerServer(model, checkpoint=resolve_model(model), workdir=tmp_path / "server") as server:
        # the JAX backend keeps what it compiles (a restarted server reuses it), under harnessrl's home
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{server.proc.pid}/environ").read_text().split("\0") if "=" in kv)
        from harnessrl.adapters.toolchain import harnessrl_home

        cache = Path(env["JAX_COMPILATION_CACHE_DIR"])
        assert cache == Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or harnessrl_home() / "jax-cache")
        trainer = TinkerTrainer(TinkerTrainerConfig(base_url=server.url, model=model, lora_rank=4, lr=2e-2))
        assert trainer.version == 0 and trainer.backend.version == "0"
        v0_client = trainer.backend.client
        with ProxyServer(ProxyConfig(engine_url="", honor_seed=True), tokenizer=load_tokenizer(model),
                         backend=trainer.backend) as proxy:
            history = []
            for step in range(2):
                sids = [_chat(proxy, 100 * step + i) for i in range(2)]
                for i, sid in enumerate(sids):
                    proxy.set_reward(sid, 1.0 - i, "ok", "submitted")
                batch = [proxy.trajectory(s) for s in sids]
                for t in batch:
                    (call,) = t.calls
                    assert set(call.versions) == {step}  # sampled by the sampler published before this step
                    assert call.flags["sampling"]["temperature"] == 1.0
                if step == 0:  # the record is exactly what the service samples for that prompt and seed
                    c = batch[0].calls[0]
                    ids, lps = _probe(v0_client, c.prompt_ids, 0)
                    assert c.completion_ids == ids and c.logprobs == pytest.approx(lps, abs=1e-5)
                m = trainer.step(batch)
                history.append(m)
                assert m.updated and m.version == step + 1 == trainer.version
                assert trainer.backend.version == str(step + 1) and trainer.backend.swaps == step + 1
                assert m.tokens == sum(sum(s.loss_mask) for t in batch for s in t.segments) and m.samples == 2
                assert m.mismatch_tokens == m.tokens and m.staleness_max == 0
                assert m.logprob_mismatch_mean is not None and m.logprob_mismatch_mean < 1e-3, m
                assert m.grad_norm > 0
            assert any(cache.iterdir()), "nothing compiled was kept"
            # after the swap the proxy's calls sample the newest weights and say so
            last = proxy.trajectory(_chat(proxy, 7))
            assert set(last.calls[0].versions) == {2}
        # the policy moved: the v0 and v2 samplers give different logprobs for one fixed sequence
        prompt = last.calls[0].prompt_ids
        ids0, lp0 = _probe(v0_client, prompt, 5)
        ids2, lp2 = _probe(trainer.backend.client, prompt, 5)
        n = min(len(ids0), len(ids2))
        if ids0[:1] == ids2[:1]:
            assert abs(lp0[0] - lp2[0]) > 1e-3, (lp0, lp2)
        else:
            assert ids0 != ids2
        out = trainer.publish(tmp_path / "pub")
        assert out == 2 and (tmp_path / "pub" / "tinker.json").read_text().startswith('{"version": 2, "path": "tinker://')
        # a checkpoint (weights + optimizer on the service) resumes a fresh trainer at version 2, same policy
        ck = trainer.save_checkpoint(tmp_path / "ck")
        resumed = TinkerTrainer(trainer.config)
        assert resumed.version == 0
        resumed.load_checkpoint(ck)
        assert (resumed.version, resumed.backend.version, resumed._steps) == (2, "2", 2)
        ids_r, lp_r = _probe(resumed.backend.client, prompt, 5)
        assert ids_r == ids2 and lp_r == pytest.approx(lp2, abs=1e-5)
        print("tinker steps:", [(m.version, round(m.loss, 4), round(m.grad_norm, 4), m.logprob_mismatch_mean,
                                 round(m.step_s, 1)) for m in history], "probe", lp0[:n], lp2[:n])


def test_train_config_selects_tinker_and_refuses_other_sampling():
    from harnessrl.trainers.base import trainer_class
    from harnessrl.trainers.loop import TrainConfig, load_config

    assert trainer_class("tinker") is TinkerTrainer
    cfg = load_config(Path(__file__).parent.parent / "examples" / "tinker" / "train-skyrl-local.toml")
    assert (cfg.tinker.base_url, cfg.tinker.model, cfg.tinker.lora_rank, cfg.tinker.loss_fn) == \
        ("http://127.0.0.1:8000", "tiny-llama", 4, "importance_sampling")
    with pytest.raises(ValueError, match=r"rollout.temperature/top_p/top_k: 0.7/1/-1 with tinker"):
        TrainConfig.model_validate({"tinker": {"model": "tiny-llama"}, "rollout": {"temperature": 0.7},
                                    "stages": ["rl"], "eval": {"points": []}})
    assert TrainConfig().tinker is None  # the built-in trainer stays the default
