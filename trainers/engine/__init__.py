"""The local CPU engine: SGLang's native HTTP API (the subset in sglang-contract.md) on torch.

    from harnessrl.trainers.engine import EngineServer
    with EngineServer(model="tiny-llama") as server:   # free loopback port
        ...  # harnessrl.gym.backends.engine_client.EngineClient(server.url)

or `python -m harnessrl.trainers.engine --model smollm2-135m --port 30000`.
Continuous batching with a KV cache (scheduler.py), greedy output equal to HF
`model.generate`, logprobs as documented in sampling.py.
"""
from harnessrl.trainers.engine.config import EngineConfig
from harnessrl.trainers.engine.runner import EngineServer, EngineStartupError, serve

__all__ = ["EngineConfig", "EngineServer", "EngineStartupError", "serve"]
