"""Shared pieces of the proxy tests: a stand-in engine served on loopback in a thread, a
scripted responder, and small HTTP helpers. Real HTTP, real tokenizer; no mocks."""
from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque

import httpx
import uvicorn

from harnessrl.gym.proxy.standin import StandinEngine


class ServedApp:
    """Any ASGI app on 127.0.0.1:<free port> in a background thread."""

    def __init__(self, app):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                break
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


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
        from harnessrl.gym.proxy.standin import default_responder

        return self.queue.popleft() if self.queue else default_responder(input_ids)


def standin(tokenizer, **kw) -> tuple[StandinEngine, Script]:
    script = Script(tokenizer)
    return StandinEngine(responder=script, **kw), script


def post(url: str, key: str, body, *, headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    h.update(headers or {})
    if raw is not None:
        return httpx.post(url, content=raw, headers=h, timeout=60)
    return httpx.post(url, json=body, headers=h, timeout=60)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body."""
    out = []
    for block in text.split("\n\n"):
        ev, data = None, []
        for line in block.splitlines():
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            out.append((ev, "\n".join(data)))
    return out
