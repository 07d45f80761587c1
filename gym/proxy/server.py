"""`ProxyServer`: the proxy on 127.0.0.1:port (and optionally a unix socket), in its own
thread and event loop, with an in-process API for the episode runner.

    with ProxyServer(ProxyConfig(engine_url=engine.url)) as proxy:
        sid, key = proxy.open_session({"harness": "mini-swe-agent", "task_id": "t1"})
        # harness: OpenAI base URL proxy.openai_base_url(sid), Anthropic proxy.anthropic_base_url(sid)
        proxy.set_reward(sid, 1.0, "ok"); traj = proxy.trajectory(sid)

Every in-process method is thread-safe; the same operations are on the admin HTTP API.
`python -m harnessrl.gym.proxy --engine-url URL` serves it as its own process and prints
one JSON line (url, admin_token) once it accepts connections.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
from typing import Any

from ..trajectory import Trajectory
from .app import build_app
from .config import ProxyConfig
from .core import ProxyCore


class ProxyServer:
    def __init__(self, config: ProxyConfig, tokenizer=None, backend=None):
        """`backend`: a `GenerationBackend` object to generate through (a trainer's in-process
        generation side, a Tinker sampling client) instead of `config.backend` at `config.engine_url`."""
        self.config = config
        self.admin_token = config.admin_token or secrets.token_urlsafe(24)
        self.core = ProxyCore(config, tokenizer, backend=backend)
        self.url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "ProxyServer":
        import uvicorn

        cfg = self.config
        socks = [socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)]
        socks[0].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        socks[0].bind((cfg.host, cfg.port))
        if cfg.uds_path:
            if os.path.exists(cfg.uds_path):
                os.unlink(cfg.uds_path)
            u = socket.socket(socket.AF_UNIX)
            u.bind(cfg.uds_path)
            os.chmod(cfg.uds_path, 0o666)  # harness users inside containers differ from ours
            socks.append(u)
        port = socks[0].getsockname()[1]
        self.url = f"http://[{cfg.host}]:{port}" if ":" in cfg.host else f"http://{cfg.host}:{port}"
        ucfg = uvicorn.Config(build_app(self.core, self.admin_token), log_level="warning", lifespan="on",
                              loop=_best("uvloop", "asyncio"), http=_best("httptools", "h11"),
                              timeout_keep_alive=75, backlog=4096,
                              proxy_headers=False)  # the peer is the connection's: no forwarding header is trusted
        self._server = uvicorn.Server(ucfg)
        started = threading.Event()

        def serve() -> None:
            try:
                loop = asyncio.new_event_loop() if ucfg.loop == "asyncio" else __import__("uvloop").new_event_loop()
                asyncio.set_event_loop(loop)
                self._loop = loop
                loop.run_until_complete(self._serve(socks, started))
            except BaseException as e:  # surfaced by start()
                self._error = e
                started.set()

        self._thread = threading.Thread(target=serve, name="harnessrl-proxy", daemon=True)
        self._thread.start()
        if not started.wait(timeout) or self._error is not None or not self._server.started:
            raise RuntimeError(f"proxy did not start: {self._error!r}")
        return self

    async def _serve(self, socks, started: threading.Event) -> None:
        task = asyncio.ensure_future(self._server.serve(sockets=socks))
        while not self._server.started and not task.done():
            await asyncio.sleep(0.01)
        started.set()
        await task

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.core.store.close()
        if self.config.uds_path and os.path.exists(self.config.uds_path):
            os.unlink(self.config.uds_path)

    def __enter__(self) -> "ProxyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def __aenter__(self) -> "ProxyServer":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self.stop)

    # -- in-process API (thread-safe) ---------------------------------------------------
    def openai_base_url(self, sid: str) -> str:
        return f"{self.url}/s/{sid}/v1"

    def anthropic_base_url(self, sid: str) -> str:
        return f"{self.url}/s/{sid}"

    def open_session(self, meta: dict[str, Any] | None = None) -> tuple[str, str]:
        return self.core.open_session(meta or {})

    def close_session(self, sid: str) -> None:
        self.core.close_session(sid)

    def set_reward(self, sid: str, reward: float | None, status: str = "ok", termination: str = "") -> None:
        self.core.set_reward(sid, reward, status, termination)

    def trajectory(self, sid: str) -> Trajectory:
        if sid not in self.core.sessions:
            raise KeyError(f"unknown session {sid!r}")
        return self.core.store.trajectory(sid)

    def _on_loop(self, fn) -> None:
        if threading.current_thread() is self._thread:
            fn()
            return

        async def call():
            fn()
        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def pause(self) -> None:
        """New calls wait (then 429); interrupted generations wait for resume()."""
        self._on_loop(self.core.gate.pause)

    def resume(self) -> None:
        self._on_loop(self.core.gate.resume)

    def use_lora(self, name: str | None) -> bool:
        """Name LoRA adapter `name` in every generation from now on (None: the base weights), as
        a weight sync that loaded it asks inside its pause; False when the generation backend
        has no per-request adapter (an in-process or Tinker backend serves its own policy)."""
        select = getattr(self.core.engine, "use_lora", None)
        if select is None:
            return False
        self._on_loop(lambda: select(name))
        return True

    def use_engines(self, urls: list[str]) -> bool:
        """Route generations only to these engines from now on (a weight sync reached them; any
        other is behind); False when the proxy has a single engine (nothing to choose)."""
        serve = getattr(self.core.engine, "serve_only", None)
        if serve is None:
            return False
        self._on_loop(lambda: serve(urls))
        return True

    def set_policy_version(self, version: int) -> None:
        """The trainer's current version (the per-turn staleness check and the record use it)."""
        self.core.set_policy_version(version)

    def stats(self) -> dict[str, Any]:
        return self.core.stats()


def _best(preferred: str, fallback: str) -> str:
    try:
        __import__(preferred)
        return preferred
    except ImportError:
        return fallback
