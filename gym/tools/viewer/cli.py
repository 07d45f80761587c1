"""`harnessrl view [RUN_DIR ...]`: serve the viewer on loopback until Ctrl-C.

Contract: each RUN_DIR is a rollout, train or collect folder (`RunFiles.find`); with none,
`runs/train` (the default train run's folder) is viewed. Two or more runs open the compare
page (reward curves overlaid, episode outcomes per task). The page is at the printed URL;
it is served from the package and fetches only this server's API. A folder that is not a run
is one line naming it, exit status 2.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harnessrl view", description=(__doc__ or "").splitlines()[0])
    p.add_argument("runs", nargs="*", help="run folders (default: runs/train)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free one)")
    p.add_argument("--model", default=None, help="tokenizer to decode with (default: the model each record names)")
    args = p.parse_args(argv)
    from harnessrl.gym.tools.viewer.run_index import RunFolderError, RunIndex

    paths = args.runs or ["runs/train"]
    try:
        indexes = [RunIndex(path, name=path) for path in paths]
    except RunFolderError as e:
        hint = "" if args.runs else " (the default train run's folder; pass RUN_DIR ...)"
        print(f"harnessrl view: {e}{hint}", file=sys.stderr)
        return 2
    import socket

    import uvicorn

    from harnessrl.gym.tools.viewer.app import build_app

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        print(f"harnessrl view: --port {args.port}: cannot listen on {args.host}:{args.port} ({e.strerror}); "
              "fix: pass another --port (0 picks a free one)", file=sys.stderr)
        return 2
    sock.listen(128)  # listening before the URL is printed: a client that reads it can connect at once
    host, port = sock.getsockname()[:2]
    n = sum(ix.query("SELECT COUNT(*) FROM episodes")[0][0] for ix in indexes)
    page = "#/compare" if len(indexes) > 1 else "#/run/0"
    print(f"harnessrl view: http://{host}:{port}/{page}  ({len(indexes)} run(s), {n} episodes; Ctrl-C stops)",
          flush=True)
    server = uvicorn.Server(uvicorn.Config(build_app(indexes, args.model), log_level="warning", lifespan="off"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
