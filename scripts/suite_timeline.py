"""Where a parallel test run's time went: read the per-worker timings that tests/conftest.py
writes when HARNESSRL_PYTEST_TIMES names a folder, and print each worker's busy time and end,
the longest groups, and what the last worker to finish ran last.

    HARNESSRL_PYTEST_TIMES=/tmp/t .venv/bin/python -m pytest
    .venv/bin/python scripts/suite_timeline.py /tmp/t [--write tests/durations.json]

`--write` records each group's (and each ungrouped test's) seconds, which tests/conftest.py
uses to start the longest groups first.
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def read(folder: Path) -> list[tuple[str, str, float, float, str, float]]:
    """(worker, test id, start, end, group, host CPU seconds: the worker's and its reaped
    children's; 0 from files written before the column existed)."""
    rows = []
    for f in sorted(folder.glob("*.tsv")):
        for line in f.read_text().splitlines():
            worker, nodeid, start, end, group, *cpu = line.split("\t")
            rows.append((worker, nodeid, float(start), float(end), group, float(cpu[0]) if cpu else 0.0))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--write", type=Path, help="write group seconds to this JSON file")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    rows = read(args.folder)
    if not rows:
        print("no timings: run pytest with HARNESSRL_PYTEST_TIMES set to this folder")
        return 1
    t0 = min(r[2] for r in rows)
    by_worker: dict[str, list] = collections.defaultdict(list)
    for r in rows:
        by_worker[r[0]].append(r)
    print(f"{len(rows)} tests, wall {max(r[3] for r in rows) - t0:.0f} s from the first test's start")
    for w, rs in sorted(by_worker.items()):
        busy = sum(r[3] - r[2] for r in rs)
        print(f"  {w}: {len(rs)} tests, busy {busy:.0f} s, last test ends at {max(r[3] for r in rs) - t0:.0f} s")
    groups: dict[str, float] = collections.defaultdict(float)
    cpu: dict[str, float] = collections.defaultdict(float)
    for _, nodeid, s, e, g, c in rows:
        groups[g or nodeid] += e - s
        cpu[g or nodeid] += c
    print(f"longest groups (or ungrouped tests), of {len(groups)}, with the host CPU seconds of the worker "
          f"and its reaped children ({sum(cpu.values()):.0f} s in all; a sandbox's processes are not in it):")
    for name, secs in sorted(groups.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {secs:7.1f} s  cpu {cpu[name]:6.1f} s  {name}")
    print("most host CPU:")
    for name, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  cpu {c:6.1f} s  wall {groups[name]:7.1f} s  {name}")
    last = max(by_worker, key=lambda w: max(r[3] for r in by_worker[w]))
    print(f"the last worker to finish ({last}) ran last:")
    for _, nodeid, s, e, g, _ in sorted(by_worker[last], key=lambda r: r[2])[-args.top:]:
        print(f"  {s - t0:6.0f}-{e - t0:6.0f} s  {nodeid}")
    if args.write:
        args.write.write_text(json.dumps({k: round(v, 1) for k, v in sorted(groups.items())}, indent=0) + "\n")
        print(f"wrote {len(groups)} group durations to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
