"""Shared pieces of the proxy tests: a stand-in engine served on loopback in a thread, a
scripted responder, and small HTTP helpers. Real HTTP, real tokenizer; no mocks."""
from __future__ import annotations

import contextlib
import re
from collections import deque

import httpx

from harnessrl.gym.doubles.standin import StandinEngine
from harnessrl.gym.served import ServedApp  # noqa: F401  (tests import it from here)

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()


class Script:
    """Responder that plays scripted replies (text -> ids + <|im_end|>) in order; when the
    script is empty it falls back to the default prompt-derived reply."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.queue: deque[list[int]] = deque()

    def say(self, *texts: str, eos: bool = True) -> None:
        for t in texts:
            self.queue.append(self.tok.encode(t, add_special_tokens=False) + ([2] if eos else []))

    def __call__(self, input_ids: list[int]) -> list[int]:
        from harnessrl.gym.doubles.standin import default_responder

        return self.queue.popleft() if self.queue else default_responder(input_ids)


def standin(tokenizer, **kw) -> tuple[StandinEngine, Script]:
    script = Script(tokenizer)
    return StandinEngine(responder=script, **kw), script


def post(url: str, key: str, body, *, headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    h.update(headers or {})
    if raw is not None:
        return HTTP.post(url, content=raw, headers=h, timeout=60)
    return HTTP.post(url, json=body, headers=h, timeout=60)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body."""
    out = []
    for block in text.split("\n\n"):
        ev, data = None, []
        for line in re.split(r"\r\n|\r|\n", block):  # SSE's line ends only: splitlines() also cuts at U+0085, U+2028
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            out.append((ev, "\n".join(data)))
    return out


def check_exact(traj, engine_calls: list[dict]) -> None:
    """The record is exactly what the engine was given and sampled, call by call; each
    segment is its last call's prompt + completion; loss mask 1 exactly on sampled ids."""
    traj.validate()
    assert len(traj.calls) == len(engine_calls), (len(traj.calls), len(engine_calls))
    for c, ec in zip(traj.calls, engine_calls):
        assert c.prompt_ids == ec["input_ids"], f"call {c.index}: recorded prompt != engine input"
        assert c.completion_ids == ec["output_ids"], f"call {c.index}: recorded completion != engine output"
    for si, seg in enumerate(traj.segments):
        calls = [c for c in traj.calls if c.segment == si]
        last = calls[-1]
        assert seg.token_ids == last.prompt_ids + last.completion_ids
        mask = [0] * len(seg.token_ids)
        for c in calls:  # each call's prompt extends the previous call's prompt + completion
            assert seg.token_ids[:len(c.prompt_ids)] == c.prompt_ids
            for j in range(len(c.prompt_ids), len(c.prompt_ids) + len(c.completion_ids)):
                mask[j] = 1
        assert seg.loss_mask == mask
        sampled = [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m]
        assert sampled == [lp for c in calls for lp in c.logprobs]


def fill_placeholders(obj, model: str = "policy"):
    """A fixture body with every `<text: N chars>` / `<key: N chars>` replaced by own text."""
    import re

    pat = re.compile(r"^<(text|key): (\d+) chars>$")
    words = "the quick brown fox jumps over a lazy dog while tests run in the sandbox "

    def fill(x):
        if isinstance(x, dict):
            return {fill(k): fill(v) for k, v in x.items()}
        if isinstance(x, list):
            return [fill(v) for v in x]
        if isinstance(x, str):
            m = pat.match(x)
            if m:
                n = min(int(m.group(2)), 1500)
                if m.group(1) == "key":
                    return "k" * n
                return (words * (n // len(words) + 1))[:n]
            if x == "probe-model":
                return model
        return x
    return fill(obj)


def fixture_requests(name: str) -> list[dict]:
    import json
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "harness-requests" / name  # copied from shared/fixtures
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def dialect_env(tok, engine_stream: bool):
    """A stand-in engine and a proxy serving it: the dialect tests' environment. Streamed
    calls either buffer one engine request or relay the engine's token stream."""
    from types import SimpleNamespace

    from harnessrl.gym.proxy import ProxyConfig, ProxyServer

    eng, script = standin(tok)
    cfg = ProxyConfig(engine_url="", served_models=["policy", "probe-model"], engine_stream=engine_stream)
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        yield SimpleNamespace(eng=eng, script=script, proxy=p)


@contextlib.contextmanager
def tiny_dialect_env(engine_stream: bool = False):
    """`dialect_env` on tiny-llama's tokenizer (SmolLM2's); skips the test where it is not prepared."""
    import pytest

    from harnessrl.gym.models import load_tokenizer

    try:
        tok = load_tokenizer("tiny-llama")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"tiny-llama tokenizer not prepared: {e}")
    with dialect_env(tok, engine_stream) as e:
        yield e
