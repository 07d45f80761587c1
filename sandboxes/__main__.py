"""`python -m harnessrl.sandboxes reap|build-base|which`: sandbox housekeeping from a shell.

The `harnessrl` CLI can expose the same as `harnessrl sandbox ...` by calling `main(argv)`.
"""
from __future__ import annotations

import argparse
import sys

from harnessrl.sandboxes import BACKENDS, SandboxUnavailable, make_backend


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="harnessrl sandbox", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    reap = sub.add_parser("reap", help="remove sandboxes left by crashed runs")
    reap.add_argument("--older-than", type=float, default=3600.0, metavar="SECONDS",
                      help="only those created at least this long ago (default 3600)")
    reap.add_argument("--run-id", default=None, help="only this run's docker containers")
    sub.add_parser("build-base", help="build the offline base image (no-op when present)")
    sub.add_parser("which", help="print the backend `auto` picks here, or why none works")
    args = ap.parse_args(argv)
    if args.cmd == "build-base":
        from harnessrl.sandboxes.images import build_base_image
        print(build_base_image())
        return 0
    if args.cmd == "which":
        try:
            print(make_backend("auto").name)
            return 0
        except SandboxUnavailable as e:
            print(e, file=sys.stderr)
            return 1
    for name in BACKENDS:
        try:
            backend = make_backend(name)
        except SandboxUnavailable as e:
            print(f"{name}: skipped ({e})")
            continue
        n = backend.reap(older_than_s=args.older_than, run_id=args.run_id)
        print(f"{name}: removed {n} sandbox(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
