"""The `harnessrl` command line: the one composition root that may import every layer.

Each subcommand imports what it needs lazily, so `harnessrl --help` stays instant.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the version")
    args = parser.parse_args(argv)
    if args.cmd == "version":
        from harnessrl import __version__

        print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
