"""`python -m harnessrl.gym.proxy --engine-url URL [--backend sglang|vllm] [--port N] ...`: serve the proxy
as its own process; prints one JSON line {url, admin_token, pid} once it accepts calls.

`--config FILE` takes a whole `ProxyConfig` as JSON instead of the flags (how a run's extra
proxies start, `gym.proxies`). The admin token comes from the first line of standard input with
`--admin-token-stdin` (it then appears in no /proc file), else the environment variable
`HARNESSRL_PROXY_ADMIN_TOKEN` (readable by the same user only; a command line is readable by
every local user), else `--admin-token`, else a random one. `--watch-stdin`: exit when standard
input closes (the parent that holds its other end died), so no proxy outlives its run."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from .config import ADMIN_TOKEN_ENV as TOKEN_ENV


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harnessrl.gym.proxy", description=__doc__)
    ap.add_argument("--config", default=None, help="a ProxyConfig as JSON (then the flags below are not used)")
    ap.add_argument("--engine-url", action="append",
                    help="the engine's base URL; repeat it for several engines (each session sticks to one)")
    ap.add_argument("--backend", default="sglang",
                    help="how the engine is reached: sglang (also the local engine), vllm, or module:Class")
    ap.add_argument("--vllm-route", choices=["generate", "completions"], default="generate",
                    help="with --backend vllm: /inference/v1/generate (token ids) or /v1/completions (token-id prompt)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--served-model", action="append", default=None, help="model name harnesses ask for (repeat)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--uds", default=None)
    ap.add_argument("--db", default=":memory:")
    ap.add_argument("--admin-token", default=None, help=f"prefer the environment variable {TOKEN_ENV}")
    ap.add_argument("--admin-token-stdin", action="store_true", help="read the admin token from stdin's first line")
    ap.add_argument("--watch-stdin", action="store_true", help="exit when standard input closes")
    a = ap.parse_args(argv)
    from .config import ProxyConfig
    from .server import ProxyServer

    token = os.environ.pop(TOKEN_ENV, None) or a.admin_token
    if a.admin_token_stdin:
        token = sys.stdin.buffer.readline().decode().strip()
        if not token:
            ap.error("--admin-token-stdin: standard input's first line is empty")
    if a.config is not None:
        with open(a.config) as f:
            cfg = ProxyConfig.model_validate_json(f.read())
        cfg = cfg.model_copy(update={"admin_token": token or cfg.admin_token})
    elif not a.engine_url:
        ap.error("one of --config or --engine-url is required")
    else:
        cfg = ProxyConfig(engine_url=a.engine_url, backend=a.backend, vllm_route=a.vllm_route, model=a.model,
                          served_models=a.served_model or ["policy"], host=a.host, port=a.port, uds_path=a.uds,
                          db_path=a.db, admin_token=token)
    server = ProxyServer(cfg).start()
    print(json.dumps({"url": server.url, "admin_token": server.admin_token, "pid": os.getpid()}), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if a.watch_stdin:
        threading.Thread(target=_until_eof, args=(done,), name="harnessrl-proxy-stdin", daemon=True).start()
    done.wait()
    server.stop()
    return 0


def _until_eof(done: threading.Event) -> None:
    """Set `done` once standard input reaches its end (the parent closed it, or died)."""
    try:
        while sys.stdin.buffer.read1(4096):
            pass
    except (OSError, ValueError):
        pass
    done.set()


if __name__ == "__main__":
    sys.exit(main())
