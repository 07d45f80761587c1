"""Write a synthesis run's tasks: bundles, sandbox verification, the split files, the manifest.

Contract: `emit(cfg, out, projects, staged, rejected, log)` writes `<out>/repos/<project>.bundle`
with the clean commit and every staged task's bug commit, then (with `cfg.verify`) checks
every staged task through `harnessrl.gym.tasks.suites.check.check_task` in a sandbox of
`cfg.backend` (base 0.0 with its FAIL_TO_PASS failing and PASS_TO_PASS passing, gold 1.0),
drops the invalid ones (reason `verify_failed`, or `verify_infra` for an infrastructure
error) and rewrites each bundle with the valid tasks' commits only. It writes `train.jsonl`
and `heldout.jsonl` (rows sorted by instance_id, keys sorted), `meta.jsonl`, and returns the
manifest (counts per split and difficulty, rejections by reason, clean commits).
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from harnessrl.gym.tasks.synth import source
from harnessrl.gym.tasks import Task

__all__ = ["emit", "verify"]


def _task(row: dict, out: Path) -> Task:
    return Task(**{**row, "source": str((out / row["source"]).resolve())})


def verify(tasks: list[Task], backend_name: str, log, workers: int = 1) -> dict[str, dict[str, Any]]:
    """instance_id -> check_task's result, one sandbox per task (each has its own base commit),
    `workers` sandboxes at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from harnessrl.gym.tasks.suites.check import check_suite
    from harnessrl.sandboxes import make_backend

    backend = make_backend(backend_name)
    results: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def note(r: dict[str, Any]) -> None:
        with lock:
            results[r["instance_id"]] = r
            log(f"verify {len(results)}/{len(tasks)} {'ok' if r['valid'] else 'INVALID'} "
                f"{r['instance_id']} {r['problem']}")

    chunks = [tasks[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers, thread_name_prefix="synth-verify") as pool:
        for future in [pool.submit(check_suite, chunk, backend, None, note) for chunk in chunks if chunk]:
            future.result()
    return results


def emit(cfg, out: Path, projects: list, staged: list[tuple], rejected: Counter, log) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for p in projects:
        refs = {row["instance_id"]: bug for q, row, bug, _ in staged if q is p}
        source.write_bundle(p.repo, p.clean, refs, out / "repos" / f"{p.name}.bundle")
    checks: dict[str, dict[str, Any]] = {}
    if cfg.verify and staged:
        checks = verify([_task(row, out) for _, row, _, _ in staged], cfg.backend, log, cfg.verify_workers)
    kept = []
    for p, row, bug, meta in staged:
        check = checks.get(row["instance_id"])
        if check is not None:
            meta = {**meta, "verified": True, "base_reward": check["base_reward"], "gold_reward": check["gold_reward"]}
            if not check["valid"]:
                infra = "infra_error" in check["problem"]
                rejected["verify_infra" if infra else "verify_failed"] += 1
                log(f"dropped {row['instance_id']}: {check['problem']}")
                continue
        else:
            meta = {**meta, "verified": False}
        kept.append((p, row, bug, meta))
    if cfg.verify:
        for p in projects:
            refs = {row["instance_id"]: bug for q, row, bug, _ in kept if q is p}
            source.write_bundle(p.repo, p.clean, refs, out / "repos" / f"{p.name}.bundle")
    files = {"train": [], "heldout": []}
    for _, row, _, meta in sorted(kept, key=lambda t: t[1]["instance_id"]):
        files[meta["split"]].append(row)
    for name, rows in files.items():
        with open(out / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
    with open(out / "meta.jsonl", "w") as f:
        for _, _, _, meta in sorted(kept, key=lambda t: t[3]["instance_id"]):
            f.write(json.dumps(meta, sort_keys=True) + "\n")
    counts = Counter((m["split"], m["difficulty"]) for _, _, _, m in kept)
    return {
        "seed": cfg.seed, "config": cfg.model_dump(),
        "projects": {p.name: {"origin": p.origin, "clean_commit": p.clean, "bundle": f"repos/{p.name}.bundle",
                              "candidates": len(p.candidates), "tests": len(p.base.results),
                              "failing_at_clean": p.failing_at_clean} for p in projects},
        "tasks": len(kept), "verified": bool(cfg.verify),
        "by_split": {s: len(rows) for s, rows in files.items()},
        "by_difficulty": dict(sorted(Counter(m["difficulty"] for _, _, _, m in kept).items())),
        "by_split_and_difficulty": {f"{s}/{d}": n for (s, d), n in sorted(counts.items())},
        "rejected": dict(sorted(rejected.items())),
    }
