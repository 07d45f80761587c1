"""Write a SkyRL dataset (JSONL) with one row per harnessrl task.

Each row: `prompt` (a one-message conversation naming the task: SkyRL's dataset needs one, the
harness writes its own prompts), `env_class` "harnessrl", and the columns SkyRL hands the
generator as `env_extras`: `task_id` and `suite`.

    python examples/skyrl/prepare_dataset.py --suite builtin --out train.jsonl [--tasks ID ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(suite: str, tasks: list[str] | None = None) -> list[dict]:
    from harnessrl.gym.tasks.loaders import load_suite

    out = []
    for t in load_suite(suite):
        if tasks is None or t.instance_id in tasks:
            title = (t.problem_statement.strip().splitlines() or [t.instance_id])[0][:200]
            out.append({"prompt": [{"role": "user", "content": title}], "env_class": "harnessrl",
                        "task_id": t.instance_id, "suite": suite})
    if not out:
        raise SystemExit(f"no task of suite {suite!r} matches --tasks {tasks}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="builtin", help="suite name or .jsonl/.parquet task file")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--tasks", nargs="*", default=None, help="only these instance ids")
    a = ap.parse_args()
    data = rows(a.suite, a.tasks)
    Path(a.out).expanduser().parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).expanduser().write_text("".join(json.dumps(r) + "\n" for r in data))
    print(json.dumps({"rows": len(data), "out": str(Path(a.out).expanduser())}))


if __name__ == "__main__":
    main()
