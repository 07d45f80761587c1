"""Generation backends: how the proxy turns prompt token ids into sampled token ids.

The proxy generates only through the small `GenerationBackend` contract (`protocol.py`):
token ids in; token ids, logprobs, finish reason and weight version out; an aborted
generation comes back with `finish_reason == "abort"` and its partial output, and the
proxy resumes it with prompt + tokens so far (`gym/proxy/generation.py`), the same way for
every backend, so per-token versions and interruption mean the same everywhere.

Backends, by short name (a full "module:Class" path is accepted too):
- `sglang`: SGLang's native `/generate` (and the local engine, which speaks it);
- `vllm`: vLLM's token-in/token-out `/inference/v1/generate`, or `/v1/completions` with
  token-id prompts (`VllmBackend(..., route="completions")`);
- `inprocess.CallableBackend`: an async callable in the same process (a trainer's own server
  manager: verl's `server_manager.generate`, SkyRL's inference engine client), possibly on
  another event loop;
- `tinker.TinkerBackend`: a Tinker `SamplingClient` (hosted Tinker, SkyRL's Tinker server).
The last two are objects, not URLs: they are handed to the proxy (`ProxyServer(backend=...)`).
Several URLs of one kind make a `router.RoutedBackend` (`make_routed`): each session sticks to
one engine; `fleet.EngineFleet` fans a weight sync's control calls out to them all.
"""
from __future__ import annotations

from typing import Any

from harnessrl.registry import choice, resolve

from harnessrl.gym.backends.engine_client import EngineTimeouts
from .protocol import GenerationBackend

#: URL-reachable backends: short name -> "module:Class" (imported lazily).
BACKENDS: dict[str, str] = {
    "sglang": "harnessrl.gym.backends.engine_client:EngineClient",
    "vllm": "harnessrl.gym.backends.vllm:VllmBackend",
}


#: A generation backend as a config field (`ProxyConfig.backend`): a `BACKENDS` name or a
#: "module:Class" path, refused at validation time otherwise, with the valid names.
BackendName = choice(BACKENDS, "generation backend")


def backend_class(name: str) -> type:
    """The class behind a short name or a "module:Class" path; unknown names list the valid ones."""
    return resolve(BACKENDS, name, "generation backend")


def make_backend(name: str, url: str, *, timeout: float = 600.0, timeouts: EngineTimeouts | None = None,
                 **kw: Any) -> GenerationBackend:
    """A URL backend by name. `sglang` gets the proxy's lean keep-alive transport."""
    if name == "sglang":
        from ..proxy.engine_http import make_engine_client

        return make_engine_client(url, timeout=timeout, timeouts=timeouts)
    return backend_class(name)(url, timeout=timeout, timeouts=timeouts, **kw)


def engine_urls(value: str | list[str]) -> str | list[str]:
    """A config's engine URL(s) checked: a list must be non-empty, of distinct non-empty URLs;
    a list of one is that URL (one engine, as before)."""
    if not isinstance(value, list):
        return value
    urls = [u.strip().rstrip("/") for u in value]
    if not urls or not all(urls):
        raise ValueError("a list of engine URLs must be non-empty, without empty URLs")
    if len(set(urls)) != len(urls):
        raise ValueError(f"engine URLs must differ: {value}")
    return urls[0] if len(urls) == 1 else urls


def make_routed(name: str, urls: list[str], *, timeout: float = 600.0, timeouts: EngineTimeouts | None = None,
                **kw: Any) -> GenerationBackend:
    """The backend of one URL, or for several a `router.RoutedBackend` over one backend each
    (sticky per session, a failed engine routed around)."""
    if len(urls) == 1:
        return make_backend(name, urls[0], timeout=timeout, timeouts=timeouts, **kw)
    from .router import RoutedBackend

    return RoutedBackend([make_backend(name, u, timeout=timeout, timeouts=timeouts, **kw) for u in urls])


__all__ = ["BACKENDS", "BackendName", "GenerationBackend", "backend_class", "engine_urls", "make_backend",
           "make_routed"]
