"""Run SkyRL's open-source Tinker server on this machine (tests, single-machine runs).

This is a launcher, not a server of ours: the service is SkyRL's `skyrl.tinker.api`
(FastAPI; training and sampling in an engine subprocess, here with its JAX backend, which
runs on CPU). SkyRL starts that engine subprocess with `uv run --extra tinker --extra
<backend> -m skyrl.tinker.engine ...`, which needs `uv` and SkyRL's own project checkout;
the launcher starts the same module with the current Python instead, and nothing else
changes.

Version pairing (read from both packages; check again when either moves): a Tinker server
and SDK must speak the same wire protocol. SkyRL 0.3.0 answers `sample` and
`forward_backward` as JSON, which tinker >= 0.25 refuses ("only supports as proto"); SkyRL
0.4.0 answers them as protobuf and pins `tinker<0.26` (tinker 0.30+ also requires
`sample_sequence_ids` in the `asample` promise, which SkyRL 0.4.0 does not send). So the
pairing that works is SkyRL 0.4.0 + tinker 0.25.x; hosted Tinker speaks the current SDK.

Where SkyRL 0.4.0 comes from: its wheel declares Python >= 3.12, so scripts/setup.sh
(scripts/setup_tinker_server.sh) unpacks it, with one import patched for 3.11, into
`<venv>/share/harnessrl/skyrl-tinker-0.4.0/` and the tinker 0.25.0 it pins into
`<venv>/share/harnessrl/tinker-client-0.25.0/`; the server runs with both on its PYTHONPATH
(`server_pythonpath()`; HARNESSRL_SKYRL_TINKER_PATH and HARNESSRL_TINKER_CLIENT_PATH override
each). Neither is on the venv's own path, so the bridge keeps tinker 0.38 for hosted Tinker.

XLA programs the JAX backend compiles are kept in JAX's persistent cache,
`<harnessrl home>/jax-cache` (JAX_COMPILATION_CACHE_DIR, every program, however quick to
compile), so a restarted server reuses them: a second two-step run of the tests' tiny-llama
server took 44.7 s of CPU against the first's 71.9 s. A JAX_* setting of the caller's wins.

`TinkerServer(base_model, checkpoint=folder)` is a context manager: it starts the server,
waits for `/api/v1/healthz` and the engine, and stops both (process group) on exit. The
API key is not checked by SkyRL; the SDK still wants one that starts with "tml-".
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

#: Run in the server's Python: SkyRL's app, with the engine started by this interpreter.
_MAIN = """
import json, sys
import uvicorn
import skyrl.tinker.api as api
from skyrl.tinker.config import EngineConfig, config_to_argv
api._build_uv_run_cmd_engine = lambda parent, cfg: [sys.executable, "-m", "skyrl.tinker.engine", *config_to_argv(cfg)]
api.app.state.engine_config = EngineConfig.model_validate(json.loads(sys.argv[1]))
uvicorn.run(api.app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


SKYRL_VERSION, CLIENT_VERSION = "0.4.0", "0.25.0"


def _installed(name: str) -> str | None:
    path = Path(sys.prefix) / "share" / "harnessrl" / name
    return str(path) if path.is_dir() else None


def skyrl_tinker_path() -> str | None:
    """The unpacked SkyRL the server imports: HARNESSRL_SKYRL_TINKER_PATH, else this venv's
    installed copy, else None (SkyRL must then be importable by the server's Python)."""
    return os.environ.get("HARNESSRL_SKYRL_TINKER_PATH") or _installed(f"skyrl-tinker-{SKYRL_VERSION}")


def tinker_client_path() -> str | None:
    """The unpacked tinker SDK that speaks SkyRL's protocol: HARNESSRL_TINKER_CLIENT_PATH, else
    this venv's installed copy, else None."""
    return os.environ.get("HARNESSRL_TINKER_CLIENT_PATH") or _installed(f"tinker-client-{CLIENT_VERSION}")


def server_pythonpath() -> str | None:
    """Both of the above, in that order, for the server's PYTHONPATH (SkyRL imports `tinker.proto`)."""
    return os.pathsep.join(p for p in (skyrl_tinker_path(), tinker_client_path()) if p) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TinkerServer:
    """SkyRL's Tinker API server + engine as child processes; see the module doc."""

    def __init__(self, base_model: str | Path, *, checkpoint: str | Path | None = None, port: int = 0, backend: str = "jax",
                 backend_config: dict[str, Any] | None = None, python: str | None = None,
                 pythonpath: str | None = None, workdir: str | Path | None = None, startup_s: float = 600.0):
        """`base_model`: the name clients ask for (`TinkerTrainerConfig.model`); `checkpoint`: the
        folder its weights are loaded from (default: `base_model` itself is the folder).
        `python`: the interpreter that has SkyRL (default: this one). `pythonpath`:
        prepended to PYTHONPATH for the server (default: `server_pythonpath()`; "" for none)."""
        self.base_model = str(base_model)
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.python = python or sys.executable
        self.pythonpath = server_pythonpath() if pythonpath is None else pythonpath
        self.startup_s = startup_s
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tinker-server-"))
        self.config = {"base_model": self.base_model, "backend": backend,
                       **({"base_model_checkpoint_path": str(checkpoint)} if checkpoint is not None else {}),
                       "backend_config": backend_config or {"max_lora_adapters": 4, "max_lora_rank": 8},
                       "checkpoints_base": str(self.workdir / "checkpoints"),
                       "database_url": f"sqlite:///{self.workdir / 'tinker.db'}"}
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "server.log"

    def start(self) -> "TinkerServer":
        from harnessrl.adapters.toolchain import harnessrl_home

        env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(harnessrl_home() / "jax-cache"))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.pythonpath, env.get("PYTHONPATH")) if p)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.python, "-c", _MAIN, json.dumps(self.config), str(self.port)],
                                     cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.startup_s
        with httpx.Client(timeout=2) as http:  # one client for the polls: a new one loads the CA bundle (~34 ms)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"Tinker server exited with {self.proc.returncode}; log {self.log_path}:\n"
                                       f"{self.log_tail()}")
                try:
                    if http.get(self.url + "/api/v1/healthz").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Tinker server not healthy within {self.startup_s:g} s; log {self.log_path}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the API server and its engine subprocess
            self.proc.wait(30)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def __enter__(self) -> "TinkerServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["TinkerServer", "server_pythonpath", "skyrl_tinker_path", "tinker_client_path"]


def main(argv: list[str] | None = None) -> int:
    """`python -m harnessrl.trainers.bridges.tinker_server --base-model FOLDER [--port 8000]`:
    serve until interrupted; prints the URL to give as `tinker.base_url`."""
    import argparse

    p = argparse.ArgumentParser(description="Run SkyRL's Tinker server (JAX backend) on this machine")
    p.add_argument("--base-model", required=True, help="a prepared model name (tiny-llama, smollm2-135m) or a model folder")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend-config", default=None, help='JSON, e.g. {"max_lora_adapters": 4, "max_lora_rank": 8}')
    p.add_argument("--skyrl-path", default=None, help="an unpacked SkyRL >= 0.4.0 for the server (default: the one "
                   "scripts/setup.sh unpacks into the venv); the tinker client overlay is added either way")
    p.add_argument("--workdir", default=None, help="database, checkpoints and server.log (default: a temp folder)")
    a = p.parse_args(argv)
    from harnessrl.gym.models import resolve_model

    path = os.pathsep.join(p for p in (a.skyrl_path, tinker_client_path()) if p) if a.skyrl_path else None
    server = TinkerServer(a.base_model, checkpoint=resolve_model(a.base_model), port=a.port, pythonpath=path,
                          workdir=a.workdir,
                          backend_config=json.loads(a.backend_config) if a.backend_config else None)
    with server:
        print(f"Tinker server at {server.url} (base model {server.base_model}); log {server.log_path}", flush=True)
        try:
            server.proc.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
