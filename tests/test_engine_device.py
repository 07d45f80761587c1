"""The local engine's device/dtype option: float32 on CPU stays the default; bfloat16 runs the
same batching code (KV cache, padded 4D mask in the model's dtype, sampling on CPU); a CUDA
device that torch cannot see is a one-line start-up error. Real engine, real HTTP, tiny-llama."""
from __future__ import annotations

import httpx
import pytest
import torch
from pydantic import ValidationError

from harnessrl.gym.models import ModelNotPrepared, resolve_model
from harnessrl.trainers.engine import EngineConfig, EngineServer, EngineStartupError

try:
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"tiny-llama not prepared: {e}", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)
PROMPTS = [[1, 504, 3300, 28, 253], [1, 1204, 42, 7, 9000, 311, 64, 1919, 17]]


def _generate(url: str, prompt: list[int], n: int = 6) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": prompt, "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def test_defaults_are_float32_on_cpu_and_bad_values_name_the_field():
    cfg = EngineConfig()
    assert (cfg.device, cfg.dtype) == ("cpu", "float32")
    with pytest.raises(ValidationError, match="device") as e:
        EngineConfig(device="gpu0")
    assert "'gpu0' is not 'cpu', 'cuda' or 'cuda:N'" in str(e.value)
    with pytest.raises(ValidationError, match="dtype"):
        EngineConfig(dtype="float16")


def test_default_engine_loads_float32_on_cpu():
    with EngineServer(model="tiny-llama") as server:
        model = server.state.scheduler.model
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert {p.device.type for p in model.parameters()} == {"cpu"}
        assert len(_generate(server.url, PROMPTS[0])["output_ids"]) == 6


def test_bfloat16_engine_batches_like_its_own_single_requests():
    # two prompts of different lengths decoded together exercise the padded bf16 mask
    with EngineServer(model="tiny-llama", dtype="bfloat16") as server:
        assert {p.dtype for p in server.state.scheduler.model.parameters()} == {torch.bfloat16}
        alone = [_generate(server.url, p) for p in PROMPTS]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda p: _generate(server.url, p), PROMPTS))
    for a, b in zip(alone, together):
        assert a["output_ids"] == b["output_ids"]
        lps = [e[0] for e in a["meta_info"]["output_token_logprobs"]]
        assert all(isinstance(x, float) and x <= 0 for x in lps)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_device_is_a_one_line_startup_error():
    with pytest.raises(EngineStartupError, match="device 'cuda': torch sees no CUDA device here; use device 'cpu'"):
        EngineServer(model="tiny-llama", device="cuda").start()


def test_an_idle_keep_alive_connection_outlives_the_client_pool_expiry():
    # httpx drops a pooled connection after 5 s idle; the engine must keep it longer, or a
    # request written onto a connection the server is just closing fails (a ReadError after
    # a train step longer than uvicorn's 5 s default)
    import http.client
    import time
    from urllib.parse import urlparse

    with EngineServer(model="tiny-llama") as server:
        u = urlparse(server.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/health")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/health")
        second = conn.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert conn.sock is sock  # the same connection, still open
        conn.close()
