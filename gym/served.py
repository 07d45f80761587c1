"""One ASGI app served on loopback in a thread: `with ServedApp(app) as s: s.url`.

The app listens on 127.0.0.1 at a free port that is bound before uvicorn starts (so the URL
is known and taken at construction); entering returns once uvicorn accepts connections;
leaving asks it to exit and joins the thread. Used by the gymnasium env for its engine
bridge and by the adapter check and tests for the scripted policy.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any


class ServedApp:
    """Run an ASGI app with uvicorn on 127.0.0.1:<free port> in a thread (a context manager)."""

    def __init__(self, app: Any):
        import uvicorn

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "ServedApp":
        self._thread.start()
        while not self.server.started:  # uvicorn flips this once it is accepting
            if not self._thread.is_alive():
                raise RuntimeError("ASGI app server failed to start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
