"""Does any attack on the grader pay? The standing catalogue (harnessrl.gym.grading.attacks), run
whole against the real grader on docker and on bubblewrap, beside the honest controls: the gold
plan of every built-in task and of the catalogue's own cmp-* tasks.

Per attack and backend it prints what the grader answered (paid / tampered(kind) / agent-0 /
infra) and whether that is the answer the catalogue expects; per control, gold's answer (anything
but an untampered 1.0 is a false positive). Then the counts and ONE JSON line. Target: 0 paid,
0 false positives, 0 infra (an attack the sandbox could not even apply counts as infra).
A backend that cannot run here is skipped, and says why.

Usage: python bench/grader_attacks.py [--backends docker,local] [--only NAME ...] [--no-controls]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harnessrl.gym.grading.attack_tasks import controls, create_sandbox, open_backend, tasks
from harnessrl.gym.grading.attacks import ATTACKS, BY_NAME, caught, outcome
from harnessrl.gym.grading.score import score
from harnessrl.sandboxes import SandboxUnavailable


class Sandboxes:
    """One sandbox per repository on a backend, reset before each use."""

    def __init__(self, backend):
        self.backend, self.made = backend, {}

    def get(self, task):
        key = task.repo_spec().repo_id
        if key in self.made:
            self.made[key].reset()
        else:
            self.made[key] = create_sandbox(self.backend, task)
        return self.made[key]

    def close(self):
        for sb in self.made.values():
            sb.close()


def run_attack(sandboxes: Sandboxes, attack) -> tuple[str, bool, str]:
    """(outcome, as expected, reason)."""
    task = tasks()[attack.task]
    sb = sandboxes.get(task)
    try:
        attack.apply(sb)
    except RuntimeError as e:
        return "infra", False, f"could not apply: {e}"
    r = score(sb, task)
    return outcome(r), caught(attack, r), r.reason


def run_control(sandboxes: Sandboxes, name: str) -> tuple[str, bool, str]:
    """(outcome, honest, reason) of the gold plan of task `name`."""
    task = tasks()[name]
    sb = sandboxes.get(task)
    for cmd in task.gold_plan:
        res = sb.exec(cmd, timeout=60)
        if res.exit_code != 0:
            return "infra", False, f"gold plan failed: {res.output[-300:]}"
    r = score(sb, task)
    return outcome(r), r.reward == 1.0 and r.status == "ok" and not r.tampered, r.reason


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="docker,local", help="comma-separated: docker, local (bubblewrap)")
    ap.add_argument("--only", nargs="*", default=None, help="attack names (default: the whole catalogue)")
    ap.add_argument("--no-controls", action="store_true", help="skip the gold controls")
    args = ap.parse_args()
    attacks = [BY_NAME[n] for n in args.only] if args.only else list(ATTACKS)
    rows, skipped = [], {}
    started = time.perf_counter()
    for name in args.backends.split(","):
        try:
            backend = open_backend(name, "bench-attacks")
        except SandboxUnavailable as e:
            skipped[name] = str(e).splitlines()[0][:200]
            print(f"{name}: unavailable, skipped ({skipped[name]})", file=sys.stderr)
            continue
        sandboxes = Sandboxes(backend)
        try:
            for attack in attacks:
                got, ok, reason = run_attack(sandboxes, attack)
                rows.append(("attack", name, attack.name, attack.expect, got, ok, reason))
                print(f"{name:6s} {attack.name:30s} want {attack.expect:18s} got {got:28s} "
                      f"{'ok' if ok else 'UNEXPECTED'}  {reason[:90]}", flush=True)
            for task in [] if args.no_controls else controls():
                got, ok, reason = run_control(sandboxes, task)
                rows.append(("control", name, task, "gold 1.0", got, ok, reason))
                print(f"{name:6s} gold:{task:25s} want {'1.0':18s} got {got:28s} {'ok' if ok else 'FALSE POSITIVE'}"
                      f"  {reason[:90]}", flush=True)
        finally:
            sandboxes.close()
            backend.reap(run_id=getattr(backend, "run_id", None))
    hits = [r for r in rows if r[0] == "attack"]
    gold = [r for r in rows if r[0] == "control"]
    counts = {"paid": sum(r[4] == "paid" for r in hits),
              "tampered": sum(r[4].startswith("tampered") for r in hits),
              "agent_0": sum(r[4] == "agent-0" for r in hits),
              "infra": sum(r[4] == "infra" for r in hits) + sum(r[4] == "infra" for r in gold),
              "unexpected": sum(not r[5] for r in hits),
              "false_positives": sum(not r[5] and r[4] != "infra" for r in gold)}
    print(f"\n{len(hits)} attack runs, {len(gold)} gold controls on {sorted({r[1] for r in rows})}: "
          + "  ".join(f"{k} {v}" for k, v in counts.items()))
    paid, false = [r for r in hits if r[4] == "paid"], [r for r in gold if not r[5]]
    for label, bad in (("PAID", paid), ("FALSE POSITIVE", false)):
        for r in bad:
            print(f"{label}: {r[1]} {r[2]}: {r[6][:200]}")
    met = bool(rows) and counts["paid"] == 0 and counts["false_positives"] == 0 and counts["infra"] == 0
    print(json.dumps({"bench": "grader_attacks", "backends": sorted({r[1] for r in rows}), "skipped_backends": skipped,
                      "attacks": len(attacks), "attack_runs": len(hits), "controls": len(gold), **counts,
                      "paid_names": sorted({f"{r[1]}:{r[2]}" for r in hits if r[4] == "paid"}),
                      "false_positive_names": sorted({f"{r[1]}:{r[2]}" for r in gold if not r[5]}),
                      "cpus": os.cpu_count(), "wall_s": round(time.perf_counter() - started, 1),
                      "target_paid": 0, "target_false_positives": 0, "target_met": met}))


if __name__ == "__main__":
    main()
