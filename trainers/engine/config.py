"""The one config of the local engine (validation only, no side effects)."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator


class EngineConfig(BaseModel):
    """How the local engine loads its model and schedules requests."""

    model: str = "smollm2-135m"
    """A prepared model name (`harnessrl model list`) or a folder with config.json + safetensors."""

    host: str = "127.0.0.1"
    """Interface to listen on; loopback by default (the engine has no authentication)."""

    port: int = Field(30000, ge=0, le=65535)
    """TCP port; 0 picks a free one (the bound port is on `EngineServer.url`)."""

    max_running_requests: int = Field(32, ge=1)
    """Most requests decoded together in one batch; more wait in the queue."""

    max_prefill_per_step: int = Field(4, ge=1)
    """Most new requests prefilled between two decode steps, so running ones keep moving."""

    weight_version: str = "default"
    """Version reported in meta_info until the first weight update (SGLang's default name)."""

    random_seed: int = 0
    """Seed of the engine-wide sampler used by requests without `sampling_seed`."""

    incremental_streaming_output: bool = False
    """Stream only the new tokens per chunk; default False sends cumulative output, as SGLang does."""

    logprob_space: Literal["sampled", "tempered"] = "sampled"
    """Which distribution reported logprobs belong to (`engine.sampling` module doc): "sampled",
    the top-p/top-k filtered, renormalized distribution at the request's temperature that the
    token was drawn from; or "tempered", SGLang's default (temperature applied, filters not).
    `/get_model_info` reports it, so the proxy records it with every call."""

    num_threads: int | None = Field(None, ge=1)
    """torch intra-op threads; None keeps torch's default (all cores)."""

    api_key: str | None = None
    """If set, every request must carry `Authorization: Bearer <api_key>` (SGLang's --api-key)."""

    prefix_cache_mb: int = Field(1024, ge=0)
    """Memory budget of the prefix cache (KV of earlier requests reused when a new prompt starts
    the same way: a harness's next turn, the other samples of a group); 0 turns it off."""

    device: str = "cpu"
    """Where the model runs: "cpu" (default), "cuda" or "cuda:N". Sampling stays on CPU, so a
    seeded request draws the same tokens from the same logits on every device."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights and the forward pass; float32 by default. Logprobs are always taken
    from the logits cast to float32."""

    kv_preallocate: bool = True
    """Decode into preallocated KV buffers (one column written per step, `engine.kv.BatchKV`);
    False is the previous growing cache that concatenates every step (same outputs, slower;
    kept for `bench/engine_throughput.py`'s before/after)."""

    gqa_attention: bool = True
    """On CPU, attend over the grouped KV heads as cached (`engine.attention`, bit-identical);
    False keeps HF's sdpa, which copies each KV head per query head on every padded step."""

    fast_decode: bool = True
    """On CPU, decode Llama-style models with `engine.fast_decode` (fused, transposed weight copies
    for small batches, no HF per-layer overhead; same outputs to float rounding; the copies hold
    a second set of the weights in memory); False keeps HF's forward for every step."""

    cpu_matvec: Literal["auto", "on", "off"] = "auto"
    """Fast decode of up to 8 rows as one compiled C step (`engine.cpu_matvec`: single-threaded;
    its products read the weights ~1.3x faster than MKL's on one thread, once for all rows, and
    no per-op Python; a lone request's speculative verify runs in it too):
    "auto" where the engine runs on one thread (`num_threads` 1), "on" always, "off" never."""

    prompt_lookup_ngram: int = Field(6, ge=0)
    """Speculative decoding by prompt lookup (`engine.speculate`) when one request is decoding
    with the C step: draft the tokens that followed the longest earlier match (2 to this many
    tokens) of the sequence's tail, verify them in one pass. Outputs are identical to plain
    decoding, greedy or sampled (the verify pass computes each position bit for bit as a
    one-token step, and tokens are drawn with the request's own sampler); only tokens per pass
    change. 0 (or 1) turns it off."""

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", v):
            raise ValueError(f"{v!r} is not 'cpu', 'cuda' or 'cuda:N'")
        return v
