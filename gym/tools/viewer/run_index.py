"""What a run folder holds, and paged queries over its episodes.

Contract: `RunFiles.find(path)` locates a run's record: the proxy's SQLite store
(`trajectories.db`; a run served by several proxies lists its stores in `stores.json`,
`gym.proxy.run_stores`, and all of them are read as one run), the episodes' JSONL (`trajectories.jsonl`, each trajectory as its
episode closed it, with the grading metadata), and for a train run `metrics.jsonl`,
`report.json` and `config.json`; a rollout folder, a train folder (`rollouts/` inside) or a
`harnessrl collect` folder (`episodes/` inside) all work. `RunIndex` builds a small in-memory
SQLite index of one row per episode (task, harness, reward, status, termination, calls,
segments, tokens, sampled tokens, split reasons) straight from each store's tables (attached
read-only, one after the other; a session id found in two stores is refused, naming both; no token blob is read, sizes come from blob lengths) and one row per
call with its timings. The JSONL is only scanned for each session's byte offset (its records
are read one at a time, when an episode is opened); a run that has no store is indexed from
its JSONL one line at a time. `episodes()` filters, sorts and pages in SQL, so a run of any
size costs the browser one page. The index is rebuilt when the record changes (a live run:
the store's content, the JSONL's size), checked at most once a second (`refresh_s`).
"""
from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.gym.proxy.run_stores import STORES_FILE, RunStoresError, read_index
from harnessrl.gym.trajectory import Trajectory

#: Columns the episodes table sorts by (API name -> SQL column).
SORTABLE = ("order", "task_id", "harness", "reward", "status", "termination", "calls", "segments", "tokens", "sampled")
_SID_AT_START = re.compile(rb'^\{"session_id":\s*"([^"]+)"')

_EPISODES = """CREATE TABLE episodes (
  sid TEXT PRIMARY KEY, ord REAL, task_id TEXT, harness TEXT, model TEXT, reward REAL, status TEXT,
  termination TEXT, calls INTEGER, segments INTEGER, tokens INTEGER, sampled INTEGER, splits TEXT,
  jsonl_off INTEGER, in_store INTEGER);
CREATE TABLE calls (sid TEXT, idx INTEGER, queue_s REAL, gen_s REAL, env_s REAL, detached INTEGER, at REAL,
  model_s REAL);
"""
_FROM_STORE = """INSERT INTO episodes
SELECT s.id, s.created, s.task_id, s.harness, s.model, s.reward, s.status, s.termination,
  COUNT(c.call_id),
  COUNT(DISTINCT CASE WHEN json_extract(c.flags, '$.detached') IS NULL THEN c.segment END),
  COALESCE(SUM(CASE WHEN json_extract(c.flags, '$.detached') IS NULL
                THEN length(c.new_prompt) / 4 + length(c.completion) / 4 END), 0),
  COALESCE(SUM(CASE WHEN json_extract(c.flags, '$.detached') IS NULL THEN length(c.completion) / 4 END), 0),
  GROUP_CONCAT(DISTINCT CASE WHEN json_extract(c.flags, '$.detached') IS NULL THEN c.split_reason END),
  NULL, ?
FROM store.sessions s LEFT JOIN store.calls c ON c.session_id = s.id GROUP BY s.id"""
_CALLS_FROM_STORE = """INSERT INTO calls SELECT session_id, idx, queue_s, gen_s, env_s,
  json_extract(flags, '$.detached') IS NOT NULL, created, queue_s + gen_s FROM store.calls"""


class RunFolderError(ValueError):
    """The path is not a run folder (no trajectories store or JSONL where looked)."""


@dataclass(frozen=True)
class RunFiles:
    root: Path
    store: Path | None
    """The run's first store (its only one, unless `stores` lists more)."""
    jsonl: Path | None
    metrics: Path | None
    report: Path | None
    config: Path | None
    stores: tuple[Path, ...] = ()
    """Every store of the run: those `stores.json` lists, else `store` alone."""

    @classmethod
    def find(cls, path: str | Path) -> "RunFiles":
        root = Path(path)
        if root.is_file() and root.name in ("trajectories.db", "trajectories.jsonl", STORES_FILE):
            root = root.parent
        if not root.is_dir():
            raise RunFolderError(f"{path}: no such run folder")

        def first(name: str) -> Path | None:
            for folder in (root, root / "rollouts", root / "episodes"):
                if (folder / name).is_file():
                    return folder / name
            return None

        store, jsonl, index = first("trajectories.db"), first("trajectories.jsonl"), first(STORES_FILE)
        try:
            stores = tuple(read_index(index.parent) or ()) if index is not None else ((store,) if store else ())
        except RunStoresError as e:
            raise RunFolderError(str(e)) from None
        store = stores[0] if stores else None
        if store is None and jsonl is None:
            raise RunFolderError(f"{path}: no trajectories.db or trajectories.jsonl here, in rollouts/ or in "
                                 "episodes/; fix: pass a rollout, train or collect run folder")

        def here(name: str) -> Path | None:
            return root / name if (root / name).is_file() else None

        return cls(root, store, jsonl, here("metrics.jsonl"), here("report.json") or first("report.json"),
                   here("config.json"), stores)

    def jsonl_stamp(self) -> tuple | None:
        """Size and mtime of the JSONL (it is only ever appended to)."""
        try:
            st = self.jsonl.stat() if self.jsonl is not None else None
        except FileNotFoundError:
            return None
        return (st.st_size, st.st_mtime_ns) if st else None


class RunIndex:
    """One run's episodes and calls, queryable; thread-safe (one lock over one connection)."""

    def __init__(self, path: str | Path, name: str | None = None, refresh_s: float = 1.0):
        self.files = RunFiles.find(path)
        self.name = name or str(path)
        self.refresh_s = refresh_s
        """How often at most a query checks whether the record changed (then rebuilds)."""
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._stamp: tuple | None = None
        self._checked = 0.0
        self.builds = 0
        """How many times the index was built (once, then once per change of the record)."""
        self._ros = [sqlite3.connect(f"file:{store.resolve()}?mode=ro", uri=True, check_same_thread=False)
                     for store in self.files.stores]
        self._build()

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        db = sqlite3.connect("file::memory:", uri=True, check_same_thread=False)
        db.executescript(_EPISODES)
        for n, store in enumerate(self.files.stores, 1):
            db.execute("ATTACH DATABASE ? AS store", (f"file:{store.resolve()}?mode=ro",))
            clash = db.execute("SELECT s.id, e.in_store FROM store.sessions s JOIN episodes e ON e.sid = s.id "
                               "LIMIT 1").fetchone()
            if clash is not None:
                db.close()
                raise RunFolderError(f"session {clash[0]!r} is in two stores of run {self.name}: "
                                     f"{self.files.stores[clash[1] - 1]} and {store}; a run's session ids are "
                                     "unique, so one of them is not this run's")
            db.execute(_FROM_STORE, (n,))
            db.execute(_CALLS_FROM_STORE)
            db.commit()
            db.execute("DETACH DATABASE store")
        if self.files.jsonl is not None:
            self._scan_jsonl(db)
        for col in ("ord", "task_id", "reward", "status", "termination", "calls", "segments", "tokens", "sampled"):
            db.execute(f"CREATE INDEX ep_{col} ON episodes({col})")
        for name, cols in (("sid", "sid, idx"), ("env", "env_s"), ("model", "detached, model_s")):
            db.execute(f"CREATE INDEX calls_{name} ON calls({cols})")
        db.commit()
        old, self._db, self._stamp = self._db, db, self._read_stamp()
        self.builds += 1
        if old is not None:
            old.close()

    def _scan_jsonl(self, db: sqlite3.Connection) -> None:
        """Offsets of the store's sessions; lines of sessions the store lacks become rows, ordered
        right after the line before them (a run without a store: in file order). A last line
        without its newline is being written and is left for the next rebuild."""
        known = dict(db.execute("SELECT sid, ord FROM episodes").fetchall())
        assert self.files.jsonl is not None
        with open(self.files.jsonl, "rb") as f:
            n, last = 0, 0.0
            while True:
                off = f.tell()
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                n += 1
                if not line.strip():
                    continue
                m = _SID_AT_START.match(line)
                sid = m.group(1).decode() if m else None
                if sid is not None and sid in known:
                    db.execute("UPDATE episodes SET jsonl_off=? WHERE sid=?", (off, sid))
                    last = known[sid]
                    continue
                try:  # not in the store (or no store): this line is the record
                    t = Trajectory.from_dict(json.loads(line))
                except (ValueError, TypeError) as e:
                    raise RunFolderError(f"{self.files.jsonl}:{n}: not a trajectory record: {e}") from None
                last = last + 1e-6 if self.files.stores else float(n)
                self._insert(db, t, off, last)
                known[t.session_id] = last

    @staticmethod
    def _insert(db: sqlite3.Connection, t: Trajectory, off: int, order: float) -> None:
        splits = ",".join(dict.fromkeys(s.split_reason for s in t.segments if s.split_reason)) or None
        db.execute("INSERT OR REPLACE INTO episodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
            t.session_id, order, t.task_id, t.harness, t.model, t.reward, t.status, t.termination, len(t.calls),
            len(t.segments), sum(len(s.token_ids) for s in t.segments), sum(sum(s.loss_mask) for s in t.segments),
            splits, off, 0))
        db.executemany("INSERT INTO calls VALUES (?,?,?,?,?,?,?,?)", [
            (t.session_id, c.index, c.queue_s, c.gen_s, c.env_s, int(c.detached), c.finished_at, c.queue_s + c.gen_s)
            for c in t.calls])

    def _fresh(self) -> sqlite3.Connection:
        """The index, rebuilt first when the record changed (checked at most every `refresh_s`)."""
        now = time.monotonic()
        if now - self._checked >= self.refresh_s:
            self._checked = now
            if self._read_stamp() != self._stamp:
                self._build()
        assert self._db is not None
        return self._db

    def _read_stamp(self) -> tuple:
        """Changes when the record does: the store's content (calls added, sessions opened, closed
        or rewarded; file times would change on a mere read, which checkpoints the WAL) and the
        JSONL's size. A reply marked undelivered after the fact shows at the next other change."""
        content = tuple(ro.execute(
            "SELECT (SELECT COUNT(*) FROM calls), (SELECT MAX(rowid) FROM calls), (SELECT COUNT(*) FROM sessions), "
            "(SELECT TOTAL(reward) FROM sessions), (SELECT COUNT(reward) FROM sessions), "
            "(SELECT COUNT(closed) FROM sessions), "
            "(SELECT TOTAL(rowid * (length(status) + 7 * length(termination))) FROM sessions)").fetchone()
            for ro in self._ros)
        return content, self.files.jsonl_stamp()

    def stamp(self) -> tuple:
        """The record's current stamp (what `trajectory` results may be cached by)."""
        with self._lock:
            self._fresh()
            assert self._stamp is not None
            return self._stamp

    # -- queries --------------------------------------------------------------------------
    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._fresh().execute(sql, args).fetchall()

    def episodes(self, limit: int = 50, offset: int = 0, sort: str = "order", desc: bool = False,
                 task: str | None = None, harness: str | None = None, status: str | None = None,
                 termination: str | None = None, split: str | None = None, min_reward: float | None = None,
                 max_reward: float | None = None) -> dict[str, Any]:
        """One page of episodes, filtered and sorted in SQL, and the total that matched.
        `task` and `split` match substrings; the others exactly (bounds inclusive)."""
        if sort not in SORTABLE:
            raise ValueError(f"sort must be one of {', '.join(SORTABLE)}, got {sort!r}")
        where, args = [], []
        for col, val, op in (("task_id", task, "LIKE"), ("harness", harness, "="), ("status", status, "="),
                             ("termination", termination, "="), ("splits", split, "LIKE"),
                             ("reward", min_reward, ">="), ("reward", max_reward, "<=")):
            if val is not None and val != "":
                where.append(f"{col} {op} ?")
                args.append(f"%{val}%" if op == "LIKE" else val)
        cond = f" WHERE {' AND '.join(where)}" if where else ""
        col = "ord" if sort == "order" else sort
        # NULL rewards (infra errors, running) sort last either way
        order = f" ORDER BY ({col} IS NULL), {col} {'DESC' if desc else 'ASC'}, ord ASC"
        cols = "sid, task_id, harness, model, reward, status, termination, calls, segments, tokens, sampled, splits"
        with self._lock:
            db = self._fresh()
            total = db.execute(f"SELECT COUNT(*) FROM episodes{cond}", args).fetchone()[0]
            rows = db.execute(f"SELECT {cols} FROM episodes{cond}{order} LIMIT ? OFFSET ?",
                              (*args, limit, offset)).fetchall()
        names = [c.strip() for c in cols.split(",")]
        return {"total": total, "offset": offset, "limit": limit,
                "rows": [dict(zip(names, r), splits=(r[-1] or "").split(",") if r[-1] else []) for r in rows]}

    def distinct(self, column: str) -> list[str]:
        """The values a filterable column takes (for the filter menus)."""
        if column not in ("harness", "status", "termination"):
            raise ValueError(f"no filter menu for {column!r}")
        return [r[0] for r in self.query(f"SELECT DISTINCT {column} FROM episodes WHERE {column} != '' "
                                         f"ORDER BY {column}")]

    def trajectory(self, sid: str) -> Trajectory:
        """The episode's record: its JSONL line (as the episode closed it) when there, else the store's."""
        rows = self.query("SELECT jsonl_off, in_store FROM episodes WHERE sid=?", (sid,))
        if not rows:
            raise KeyError(f"no episode {sid!r} in run {self.name}")
        off, in_store = rows[0]
        if off is not None and self.files.jsonl is not None:
            with open(self.files.jsonl, "rb") as f:
                f.seek(off)
                return Trajectory.from_dict(json.loads(f.readline()))
        from harnessrl.gym.proxy.store import Store

        store = Store(self.files.stores[in_store - 1])
        try:
            return store.trajectory(sid)
        finally:
            store.close()
