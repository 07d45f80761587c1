"""TinkerBackend (gym/backends/tinker.py): the proxy's generation contract over a Tinker
SamplingClient. Here the client is a small class with the SamplingClient's `sample`
signature that answers with the real `tinker.types` request objects in hand (it records the
`ModelInput` and `SamplingParams` it was given, and answers after a gate opens), so the
translation, the version snapshot of a call in flight and the time limit are pinned down
exactly. Against a real Tinker service (SkyRL's server) the same backend serves the proxy
in tests/test_bridge_tinker.py."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from harnessrl.gym.backends.protocol import GenerationBackend
from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout, EngineTimeouts

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is in the `bridges` extra")
from harnessrl.gym.backends.tinker import TinkerBackend  # noqa: E402


@dataclass
class Seq:
    tokens: list[int]
    logprobs: list[float] | None
    stop_reason: str


@dataclass
class Resp:
    sequences: list[Seq]


@dataclass
class GatedSampler:
    """Answers `reply` to every sample() once `gate` is set; records what it was asked."""

    reply: Seq
    gate: asyncio.Event | None = None
    seen: list[dict] = field(default_factory=list)

    def sample(self, prompt, num_samples, sampling_params):
        assert isinstance(prompt, tinker.types.ModelInput) and isinstance(sampling_params, tinker.types.SamplingParams)
        self.seen.append({"prompt": prompt.to_ints(), "n": num_samples, "params": sampling_params})
        return self._answer()

    async def _answer(self):
        if self.gate is not None:
            await self.gate.wait()
        return Resp([self.reply])


def test_translates_sampling_params_and_reply_exactly():
    s = GatedSampler(Seq([5, 6, 2], [-0.5, -1.25, -0.125], "stop"))
    b = TinkerBackend(s, version=3)
    assert isinstance(b, GenerationBackend) and b.base_url == "inprocess:tinker"
    res = asyncio.run(b.generate([1, 10, 11], max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=40,
                                 stop_token_ids=[2], seed=11, priority=5))
    assert (res.output_ids, res.logprobs, res.finish_reason, res.weight_version, res.prompt_tokens) == \
        ([5, 6, 2], [-0.5, -1.25, -0.125], "stop", "3", 3)
    (call,) = s.seen
    p = call["params"]
    assert call["prompt"] == [1, 10, 11] and call["n"] == 1
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, list(p.stop), p.seed) == (7, 0.7, 0.9, 40, [2], 11)
    # no stop ids: Tinker's implicit EOS stop (None), never [] (which disables EOS)
    s2 = GatedSampler(Seq([9], None, "length"))
    res = asyncio.run(TinkerBackend(s2, version="v0").generate([1], max_new_tokens=1))
    assert s2.seen[0]["params"].stop is None and s2.seen[0]["params"].seed is None
    assert res.finish_reason == "length" and res.weight_version == "v0"
    assert len(res.logprobs) == 1 and res.logprobs[0] != res.logprobs[0]  # no logprobs: NaN, as the contract says
    info = asyncio.run(TinkerBackend(s2, version=4).model_info())
    assert info["weight_version"] == "4" and info["logprob_space"] == "tempered"


def test_swap_applies_to_the_next_call_and_a_call_in_flight_keeps_its_version():
    async def run():
        old = GatedSampler(Seq([7, 8], [-1.0, -2.0], "length"), gate=asyncio.Event())
        new = GatedSampler(Seq([3], [-0.25], "stop"))
        b = TinkerBackend(old, version=0)
        in_flight = asyncio.create_task(b.generate([1, 2], max_new_tokens=2))
        while not old.seen:  # the call has reached the old client
            await asyncio.sleep(0)
        b.swap(new, 1)
        assert b.version == "1" and b.client is new and b.swaps == 1
        after = await b.generate([1, 2], max_new_tokens=2)
        old.gate.set()
        before = await in_flight
        return old, new, before, after

    old, new, before, after = asyncio.run(run())
    assert (before.output_ids, before.weight_version) == ([7, 8], "0")  # finished on the old weights
    assert (after.output_ids, after.weight_version) == ([3], "1")
    assert len(old.seen) == 1 and len(new.seen) == 1


def test_total_timeout_and_failures_are_engine_errors():
    stuck = GatedSampler(Seq([1], [-1.0], "stop"), gate=asyncio.Event())
    b = TinkerBackend(stuck, version=0, timeouts=EngineTimeouts(connect_s=None, first_byte_s=None, idle_s=None, total_s=0.2))
    with pytest.raises(EngineTimeout, match="total_s"):
        asyncio.run(b.generate([1], max_new_tokens=1))

    class Empty:
        def sample(self, prompt, num_samples, sampling_params):
            return Resp([])

    with pytest.raises(EngineError, match="inprocess:tinker generation failed: ValueError: Tinker answered request .* no sequence"):
        asyncio.run(TinkerBackend(Empty(), version=0).generate([1], max_new_tokens=1))


def test_bad_arguments_name_the_field():
    ok = GatedSampler(Seq([1], [-1.0], "stop"))
    with pytest.raises(ValueError, match="version: True is not a policy version"):
        TinkerBackend(ok, version=True)
    with pytest.raises(ValueError, match="version: '' is not"):
        TinkerBackend(ok, version="")
    with pytest.raises(TypeError, match="sampling_client: object has no sample"):
        TinkerBackend(object(), version=0)
    b = TinkerBackend(ok, version=0)
    with pytest.raises(ValueError, match="version: 1.5"):
        b.swap(ok, 1.5)
    assert b.version == "0" and b.swaps == 0


def test_env_layer_import_pulls_in_neither_torch_nor_tinker():
    code = ("import sys, harnessrl.gym.backends.tinker; "
            "print(sorted(m for m in ('torch', 'tinker') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
