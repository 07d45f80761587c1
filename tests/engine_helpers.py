"""The real local engine as its own process on loopback (`python -m harnessrl.trainers.engine`),
for tests that kill or stop an engine: tiny-llama, one torch thread, a free port."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalEngine:
    """`python -m harnessrl.trainers.engine` serving `model`, as its own process; `start()` is
    separate from construction so that several can load at once (`start_engines`)."""

    def __init__(self, model: str = "tiny-llama", weight_version: str = "0") -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([sys.executable, "-m", "harnessrl.trainers.engine", "--model", model,
                                      "--port", self.url.rsplit(":", 1)[1], "--weight-version", weight_version,
                                      "--num-threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_ready(self) -> "LocalEngine":
        while True:  # the test's own timeout bounds the start
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if HTTP.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL, and reaped: its port refuses connections from now on."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    stop = kill


def start_engines(n: int, **kw) -> list[LocalEngine]:
    """`n` engine processes started together, each answering /health."""
    engines = [LocalEngine(**kw) for _ in range(n)]
    try:
        return [e.wait_ready() for e in engines]
    except BaseException:
        for e in engines:
            e.kill()
        raise
