"""`python -m harnessrl.gym.proxy --engine-url URL [--backend sglang|vllm] [--port N] ...`: serve the proxy
as its own process; prints one JSON line {url, admin_token, pid} once it accepts calls."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harnessrl.gym.proxy", description=__doc__)
    ap.add_argument("--engine-url", required=True, action="append",
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
    ap.add_argument("--admin-token", default=None)
    a = ap.parse_args(argv)
    from .config import ProxyConfig
    from .server import ProxyServer

    cfg = ProxyConfig(engine_url=a.engine_url, backend=a.backend, vllm_route=a.vllm_route, model=a.model,
                      served_models=a.served_model or ["policy"], host=a.host, port=a.port, uds_path=a.uds,
                      db_path=a.db, admin_token=a.admin_token)
    server = ProxyServer(cfg).start()
    print(json.dumps({"url": server.url, "admin_token": server.admin_token, "pid": os.getpid()}), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
