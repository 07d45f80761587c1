"""`harnessrl tasks synth`: synthesize tasks from a repository and print what came out.

    harnessrl tasks synth --project builtin --seed 0 --out runs/synth
    harnessrl tasks synth --project path/to/checkout --max-tasks 50 --out runs/mine --no-verify
    harnessrl tasks synth --canaries-from builtin --out runs/canaries     # canary tasks (gym.tasks.synth.canary)

Prints progress on stderr, then counts per split and difficulty and per rejection reason,
then the manifest as one JSON line. Exit 0 when at least one task was written.
"""
from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl tasks synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", default="builtin",
                        help="builtin, builtin:<name>, or a path to a checkout / git bundle / .tar.gz")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tasks", type=int, default=None, help="most tasks to screen for (default: all)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-verify", action="store_true", help="skip the sandbox check (gold 1.0, base 0.0)")
    parser.add_argument("--backend", default="auto", help="sandbox backend for verification: auto, docker, local")
    parser.add_argument("--verify-workers", type=int, default=2, help="sandboxes verifying at once")
    parser.add_argument("--heldout-fraction", type=float, default=0.2)
    parser.add_argument("--hard-fraction", type=float, default=0.25, help="share of multi-mutation tasks")
    parser.add_argument("--fix-fraction", type=float, default=0.0,
                        help="share of single-mutation tasks given the exact one-line edit (difficulty trivial)")
    parser.add_argument("--fix-only", action="store_true",
                        help="only tasks with a one-line copyable fix, all at the fix level (trivial); no hard tasks")
    parser.add_argument("--fix-hint", choices=("fix", "prose"), default="fix",
                        help="how a one-line fix is stated: the sed command (fix) or in words only (prose)")
    parser.add_argument("--split-by", choices=("function", "file"), default="function",
                        help="hold out whole functions, or whole files (no held-out file in training)")
    parser.add_argument("--canaries-from", metavar="SUITE", default=None,
                        help="instead of mutating a project: a canary of every task of SUITE (hidden tests that "
                             "contradict the statement: only cheating passes), into OUT/canaries.jsonl")
    parser.add_argument("--source-root", default=None, help="with --canaries-from: where SUITE's repositories live")
    args = parser.parse_args(argv)
    if args.canaries_from is not None:
        return _canaries(args)
    from harnessrl.gym.tasks.synth.run import SynthConfig, synthesize

    try:
        cfg = SynthConfig(project=args.project, seed=args.seed, max_tasks=args.max_tasks, out=args.out,
                          verify=not args.no_verify, backend=args.backend, verify_workers=args.verify_workers,
                          heldout_fraction=args.heldout_fraction, hard_fraction=args.hard_fraction,
                          fix_fraction=args.fix_fraction, fix_only=args.fix_only,
                          fix_hint=args.fix_hint, split_by=args.split_by)
    except ValidationError as e:
        err = e.errors()[0]
        print(f"harnessrl tasks synth: --{'-'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}",
              file=sys.stderr)
        return 2
    try:
        manifest = synthesize(cfg)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"harnessrl tasks synth: {e}", file=sys.stderr)
        return 2
    print(f"{manifest['tasks']} tasks ({'verified' if manifest['verified'] else 'NOT verified'}) in "
          f"{manifest['seconds']}s: " + ", ".join(f"{k} {v}" for k, v in manifest["by_split_and_difficulty"].items()))
    print("rejected: " + (", ".join(f"{k} {v}" for k, v in manifest["rejected"].items()) or "none"))
    print(json.dumps({k: manifest[k] for k in ("tasks", "verified", "by_split", "by_difficulty", "rejected", "seconds")}))
    return 0 if manifest["tasks"] else 1


def _canaries(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harnessrl.gym.tasks.synth.canary import synthesize_canaries

    try:
        m = synthesize_canaries(args.canaries_from, Path(args.out), source_root=args.source_root,
                                verify=not args.no_verify, backend=args.backend, workers=args.verify_workers,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"harnessrl tasks synth: {e}", file=sys.stderr)
        return 2
    print(f"{m['tasks']} canaries of {m['of']} tasks ({'verified: base 0.0, gold 0.0' if m['verified'] else 'NOT verified'}) "
          f"in {Path(args.out) / 'canaries.jsonl'}; no canary: {len(m['refused'])}, invalid: {len(m['invalid'])}")
    print(json.dumps({k: m[k] for k in ("tasks", "of", "verified", "seconds")}))
    return 0 if m["tasks"] else 1


if __name__ == "__main__":
    sys.exit(main())
