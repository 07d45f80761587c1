"""The `harnessrl` command line: the one composition root that may import every layer.

Each subcommand imports what it needs lazily, so `harnessrl --help` stays instant.
"""
from __future__ import annotations

import argparse
import sys


def _cmd_doctor(args: argparse.Namespace) -> int:
    from harnessrl.gym.doctor import report, run_checks

    checks = run_checks()
    print(report(checks))
    return 0 if all(c.ok for c in checks) else 1


def _cmd_model(args: argparse.Namespace) -> int:
    from harnessrl.gym.models import MODELS, ModelNotPrepared, resolve_model

    if args.action == "list":
        for name, about in MODELS.items():
            try:
                where = str(resolve_model(name))
            except ModelNotPrepared:
                where = "not prepared (harnessrl model prepare " + name + ")"
            print(f"{name:<14} {where}\n{'':<14} {about}")
        return 0
    from harnessrl.trainers.model_prep import prepare

    for name in args.names or ["smollm2-135m"]:
        print(f"{name}: {prepare(name, force=args.force)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessrl", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the version")
    sub.add_parser("doctor", help="check Docker, base image, models, node/npm, bwrap; say how to fix each")
    p = sub.add_parser("model", help="list or prepare the offline models")
    p.add_argument("action", choices=["list", "prepare"])
    p.add_argument("names", nargs="*", help="models to prepare (default: smollm2-135m)")
    p.add_argument("--force", action="store_true", help="rebuild even when prepared")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "version":
        from harnessrl import __version__

        print(__version__)
        return 0
    handlers = {"doctor": _cmd_doctor, "model": _cmd_model}
    try:
        return handlers[args.cmd](args)
    except (FileNotFoundError, KeyError) as e:  # missing model / unknown name: one clear line
        print(f"harnessrl {args.cmd}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
