"""`harnessrl export RUN --format atif|jsonl|parquet --out PATH`: a run's trajectories, written out.

Contract: RUN is a run folder (a rollout's, or a train run's with `rollouts/` inside) or a
file: `trajectories.jsonl` is read when there (each trajectory as its episode closed it, with
the grading metadata), else the proxy's SQLite store `trajectories.db` (the durable record of
every finished call, e.g. of a run that was killed), or, for a run served by several proxies,
every store its `stores.json` lists, as one run (a session id in two stores is refused). `atif` writes one `<session_id>.json` ATIF document per trajectory into
the folder PATH, each validated before it is written (gym.tools.formats.atif); `jsonl` one
Trajectory per line; `parquet` one row per segment with per-token list columns (the store's
export schema). Messages in ATIF are decoded with the tokenizer of the run's model (`--model`
overrides; `--no-decode` leaves them empty, token ids stay exact).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from harnessrl.gym.proxy.run_stores import STORES_FILE, RunStoresError, read_index, session_owners
from harnessrl.gym.trajectory import Trajectory

FORMATS = ("atif", "jsonl", "parquet")


class ExportError(ValueError):
    """The run has no trajectories where looked, or the output cannot be written."""


def find_record(run: str | Path) -> Path:
    """The JSONL (preferred), store index or store of a run folder, or `run` itself when it is a file."""
    run = Path(run)
    if run.is_file():
        return run
    for folder in (run, run / "rollouts"):
        for name in ("trajectories.jsonl", STORES_FILE, "trajectories.db"):
            if (folder / name).is_file():
                return folder / name
    raise ExportError(f"{run}: no trajectories.jsonl, {STORES_FILE} or trajectories.db here or in {run / 'rollouts'}; "
                      "fix: pass a rollout or train run folder (or one of those files)")


def read_trajectories(run: str | Path) -> list[Trajectory]:
    path = find_record(run)
    if path.name == STORES_FILE:
        try:
            owners = session_owners(read_index(path.parent) or [])
        except RunStoresError as e:
            raise ExportError(str(e)) from None
        return [t for store in dict.fromkeys(owners.values()) for t in _from_store(store)]
    if path.suffix == ".db":
        return _from_store(path)
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(Trajectory.from_dict(json.loads(line)))
                except (ValueError, TypeError) as e:
                    raise ExportError(f"{path}:{n}: not a trajectory record: {e}") from None
    return out


def _from_store(path: Path) -> list[Trajectory]:
    from harnessrl.gym.proxy.store import Store

    store = Store(path)
    try:
        return [store.trajectory(sid) for sid in store.session_ids()]
    finally:
        store.close()


def write_parquet(trajs: list[Trajectory], path: str | Path) -> int:
    """One row per segment (the columns of Store.export_parquet); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("session_id", pa.string()), ("segment", pa.int32()), ("split_reason", pa.string()),
                        ("token_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                        ("logprobs", pa.list_(pa.float64())), ("versions", pa.list_(pa.int32())),
                        ("reward", pa.float64()), ("status", pa.string()), ("termination", pa.string()),
                        ("task_id", pa.string()), ("harness", pa.string()), ("model", pa.string()),
                        ("chat_template_hash", pa.string()), ("n_calls", pa.int32())])
    rows: list[dict[str, Any]] = []
    for t in trajs:
        for i, s in enumerate(t.segments):
            rows.append({"session_id": t.session_id, "segment": i, "split_reason": s.split_reason,
                         "token_ids": s.token_ids, "loss_mask": s.loss_mask, "logprobs": s.logprobs,
                         "versions": s.versions, "reward": t.reward, "status": t.status,
                         "termination": t.termination, "task_id": t.task_id, "harness": t.harness,
                         "model": t.model, "chat_template_hash": t.chat_template_hash, "n_calls": len(s.call_ids)})
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))
    return len(rows)


def _decoder(model: str | None) -> Callable[[list[int]], str]:
    from harnessrl.gym.models import load_tokenizer

    tok = load_tokenizer(model)
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def export(run: str | Path, fmt: str, out: str | Path, model: str | None = None, decode: bool = True) -> int:
    """Write the run's trajectories as `fmt` to `out`; returns how many trajectories."""
    from harnessrl.gym.tools.formats.atif import to_atif, validate

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    trajs = read_trajectories(run)
    out = Path(out)
    if fmt == "jsonl":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(t.to_json() + "\n" for t in trajs))
    elif fmt == "parquet":
        out.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(trajs, out)
    else:
        out.mkdir(parents=True, exist_ok=True)
        decoders: dict[str, Callable[[list[int]], str]] = {}
        for t in trajs:
            name = model or t.model
            if decode and name and name not in decoders:
                decoders[name] = _decoder(name)
            doc = to_atif(t, decoders.get(name) if decode else None)
            validate(doc)
            (out / f"{t.session_id}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return len(trajs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harnessrl export", description=(__doc__ or "").splitlines()[0])
    p.add_argument("run", help=f"run folder (or its trajectories.db / trajectories.jsonl / {STORES_FILE})")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="atif: a folder (one <session_id>.json each); jsonl/parquet: a file")
    p.add_argument("--model", default=None, help="tokenizer for ATIF messages (default: the run's model)")
    p.add_argument("--no-decode", action="store_true", help="ATIF without decoded messages (token ids only)")
    args = p.parse_args(argv)
    from harnessrl.gym.tools.formats.atif import AtifError
    from harnessrl.gym.models import ModelNotPrepared

    try:
        n = export(args.run, args.format, args.out, args.model, not args.no_decode)
    except (ExportError, AtifError, ModelNotPrepared) as e:
        print(f"harnessrl export: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"format": args.format, "trajectories": n, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
