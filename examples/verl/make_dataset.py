"""Write a verl dataset of harnessrl tasks: one parquet row per task of a suite.

Each row has verl's columns: `prompt` (verl's `data.prompt_key`; its RLHFDataset turns it
into the `raw_prompt` the agent loop receives: the task's problem statement as one user
message), `data_source`, `agent_name: harnessrl` (picks the agent loop of
examples/verl/agent_loop.yaml), `reward_model` (unused: the loop returns the hidden-test
reward itself) and `extra_info` with `index` (verl's group id), `task_id`, `suite` and,
when given, `harness`, `max_calls`, `max_new_tokens`.

    python examples/verl/make_dataset.py --suite builtin --out data/harnessrl-builtin.parquet \
        [--difficulties trivial easy] [--harness mini-swe-agent] [--max-calls 30]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def dataset_rows(suite: str = "builtin", *, tasks: list[str] | None = None, difficulties: list[str] | None = None,
                 harness: str | None = None, max_calls: int | None = None,
                 max_new_tokens: int | None = None) -> list[dict[str, Any]]:
    """The rows, in suite order (same filters as `harnessrl rollout`: ids, then difficulties)."""
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.gym.stack import load_suite_tasks

    picked = load_suite_tasks(RolloutConfig(suite=suite, tasks=tasks, difficulties=difficulties))
    rows = []
    for i, t in enumerate(picked):
        info: dict[str, Any] = {"index": i, "task_id": t.instance_id, "suite": suite, "harness": harness,
                                "max_calls": max_calls, "max_new_tokens": max_new_tokens}
        rows.append({"data_source": f"harnessrl/{suite}", "agent_name": "harnessrl",
                     "prompt": [{"role": "user", "content": t.problem_statement}], "ability": "coding",
                     "reward_model": {"style": "harnessrl", "ground_truth": ""},
                     "extra_info": {k: v for k, v in info.items() if v is not None}})
    return rows


def write_dataset(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="builtin")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", nargs="*")
    ap.add_argument("--difficulties", nargs="*")
    ap.add_argument("--harness")
    ap.add_argument("--max-calls", type=int)
    ap.add_argument("--max-new-tokens", type=int)
    a = ap.parse_args(argv)
    rows = dataset_rows(a.suite, tasks=a.tasks, difficulties=a.difficulties, harness=a.harness,
                        max_calls=a.max_calls, max_new_tokens=a.max_new_tokens)
    print(f"{write_dataset(a.out, rows)}: {len(rows)} rows")


if __name__ == "__main__":
    main()
