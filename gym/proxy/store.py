"""The durable store: one SQLite database in WAL mode, one row per finished call.

Contract: `add_call` commits before the proxy sends the call's last byte, so a killed
proxy loses no finished call. With `synchronous=NORMAL` (default) a commit survives the
process being killed; `synchronous=FULL` also survives power loss at the cost of an
fsync per call. A call row stores only the prompt tokens that are new relative to its
segment (`prefix_len` says how many it reuses), so a 40-turn session costs linear space;
`trajectory()` rebuilds segments and loss masks from the rows and hands each call record
the same delta (`CallRecord.prompt_prefix_len` + `new_prompt_ids`), so the export is
linear too. A detached row (`flags["detached"]`: an engine failure, an undelivered reply)
is kept as a call but extends no segment. `sessions()` lets a restarted
proxy find the sessions it served before.
Token ids, logprobs and versions are packed arrays (int32 / float64 / int32).
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from array import array
from pathlib import Path
from typing import Any, Iterable

from ..trajectory import CallRecord, Segment, Trajectory

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, created REAL, closed REAL, meta TEXT, reward REAL, status TEXT,
  termination TEXT, task_id TEXT, harness TEXT, model TEXT, chat_template_hash TEXT);
CREATE TABLE IF NOT EXISTS calls (
  call_id TEXT PRIMARY KEY, session_id TEXT, idx INTEGER, dialect TEXT, segment INTEGER,
  split_reason TEXT, prefix_len INTEGER, new_prompt BLOB, completion BLOB, logprobs BLOB,
  versions BLOB, finish_reason TEXT, queue_s REAL, gen_s REAL, env_s REAL, flags TEXT, created REAL);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls(session_id, idx);
"""


def _i32(xs: list[int]) -> bytes:
    return array("i", xs).tobytes()


def _f64(xs: list[float]) -> bytes:
    return array("d", xs).tobytes()


def _unpack(code: str, b: bytes) -> list:
    a = array(code)
    a.frombytes(b)
    return a.tolist()


def _parent(spawn: dict, segs: dict[int, Segment]) -> dict:
    """A spawn flag as the record keeps it: the parent call's id in place of its position
    among the parent segment's calls (None when that call came before the segment)."""
    spawn = dict(spawn)
    k, parent = spawn.pop("call", None), segs.get(spawn.get("segment"))
    ok = parent is not None and isinstance(k, int) and 0 <= k < len(parent.call_ids)
    return {**spawn, "call_id": parent.call_ids[k] if ok else None}


def _label_summary(link: dict, segs: dict[int, Segment]) -> None:
    """A summary call alone in its segment (the harness's summarization request did not extend
    its conversation) makes that segment's reason "compaction_summary"."""
    seg = segs.get(link.get("segment"))
    if seg is not None and seg.call_ids == [link.get("call_id")]:
        seg.split_reason, seg.spawned_by = "compaction_summary", None


class Store:
    """Thread-safe: the proxy loop writes, the episode runner reads from its own thread."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(_SCHEMA)

    # -- writes ------------------------------------------------------------------------
    def open_session(self, sid: str, meta: dict[str, Any], template_hash: str, model: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (sid, time.time(), None, json.dumps(meta), None, "running", "", str(meta.get("task_id", "")),
                 str(meta.get("harness", "")), model, template_hash))

    def close_session(self, sid: str) -> None:
        with self._lock:
            self._db.execute("UPDATE sessions SET closed=COALESCE(closed, ?) WHERE id=?", (time.time(), sid))

    def set_reward(self, sid: str, reward: float | None, status: str, termination: str = "") -> None:
        with self._lock:
            self._db.execute("UPDATE sessions SET reward=?, status=?, termination=? WHERE id=?",
                             (reward, status, termination, sid))

    def add_call(self, *, call_id: str, session_id: str, idx: int, dialect: str, segment: int,
                 split_reason: str | None, prefix_len: int, new_prompt: list[int], completion: list[int],
                 logprobs: list[float], versions: list[int], finish_reason: str, queue_s: float,
                 gen_s: float, env_s: float | None, flags: dict[str, Any]) -> None:
        row = (call_id, session_id, idx, dialect, segment, split_reason, prefix_len, _i32(new_prompt),
               _i32(completion), _f64(logprobs), _i32(versions), finish_reason, queue_s, gen_s, env_s,
               json.dumps(flags) if flags else "{}", time.time())
        with self._lock:
            self._db.execute("INSERT INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)

    def update_meta(self, sid: str, updates: dict[str, Any]) -> None:
        """Merge `updates` into the session's meta (e.g. the live feedback's note and time)."""
        with self._lock:
            row = self._db.execute("SELECT meta FROM sessions WHERE id=?", (sid,)).fetchone()
            if row is None:
                raise KeyError(f"unknown session {sid!r}")
            meta = json.loads(row[0] or "{}") | updates
            self._db.execute("UPDATE sessions SET meta=? WHERE id=?", (json.dumps(meta), sid))

    def delete_session(self, sid: str) -> dict[str, Any]:
        """Remove a session and its calls from disk: rows deleted with `secure_delete` (freed
        pages zeroed), the file rebuilt (`VACUUM`), the WAL checkpointed and truncated. Returns
        what was removed and the check that follows: the id's bytes appear in no file of the
        store any more (`verified`). Raises KeyError for an unknown session."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM sessions WHERE id=?", (sid,)).fetchone() is None:
                raise KeyError(f"unknown session {sid!r}")
            self._db.execute("PRAGMA secure_delete=ON")
            calls = self._db.execute("DELETE FROM calls WHERE session_id=?", (sid,)).rowcount
            self._db.execute("DELETE FROM sessions WHERE id=?", (sid,))
            if self.path != ":memory:":
                self._db.execute("VACUUM")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        found = self.files_holding(sid.encode())
        return {"session_id": sid, "calls_deleted": calls, "verified": not found, "still_in": found}

    def files_holding(self, needle: bytes) -> list[str]:
        """The store's files (the database, its WAL and shared-memory index) whose bytes hold `needle`."""
        if self.path == ":memory:":
            return []
        return [f for f in (self.path, self.path + "-wal", self.path + "-shm")
                if Path(f).exists() and needle in Path(f).read_bytes()]

    def mark_undelivered(self, call_id: str, reason: str) -> None:
        """A recorded call whose reply never reached the harness: detach it from its segment."""
        with self._lock:
            row = self._db.execute("SELECT flags FROM calls WHERE call_id=?", (call_id,)).fetchone()
            if row is None:
                raise KeyError(f"no call {call_id!r} in {self.path}")
            flags = dict(json.loads(row[0] or "{}"), detached="undelivered", undelivered=reason)
            self._db.execute("UPDATE calls SET flags=? WHERE call_id=?", (json.dumps(flags), call_id))

    # -- reads -------------------------------------------------------------------------
    def sessions(self) -> list[tuple[str, dict[str, Any], bool]]:
        """(id, meta, closed) of every session in the store, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT id, meta, closed FROM sessions ORDER BY created").fetchall()
        return [(sid, json.loads(meta or "{}"), closed is not None) for sid, meta, closed in rows]

    def summaries(self) -> list[dict[str, Any]]:
        """One row per session, oldest first: id, times, reward, status, harness, model,
        template hash, meta and its number of calls (no tokens read)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT s.id, s.created, s.closed, s.reward, s.status, s.termination, s.harness, s.model, "
                "s.chat_template_hash, s.meta, (SELECT COUNT(*) FROM calls c WHERE c.session_id = s.id) "
                "FROM sessions s ORDER BY s.created").fetchall()
        keys = ("session_id", "created", "closed", "reward", "status", "termination", "harness", "model",
                "chat_template_hash", "meta", "calls")
        return [dict(zip(keys, r)) | {"meta": json.loads(r[9] or "{}")} for r in rows]

    def session_ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT id FROM sessions ORDER BY created")]

    def call_count(self, sid: str | None = None) -> int:
        with self._lock:
            if sid is None:
                return self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
            return self._db.execute("SELECT COUNT(*) FROM calls WHERE session_id=?", (sid,)).fetchone()[0]

    def trajectory(self, sid: str) -> Trajectory:
        with self._lock:
            s = self._db.execute("SELECT meta, reward, status, termination, task_id, harness, model, "
                                 "chat_template_hash FROM sessions WHERE id=?", (sid,)).fetchone()
            if s is None:
                raise KeyError(f"no session {sid!r} in {self.path}")
            rows = self._db.execute("SELECT call_id, idx, dialect, segment, split_reason, prefix_len, new_prompt, "
                                    "completion, logprobs, versions, finish_reason, queue_s, gen_s, env_s, flags, created "
                                    "FROM calls WHERE session_id=? ORDER BY idx", (sid,)).fetchall()
        segs: dict[int, Segment] = {}
        calls: list[CallRecord] = []
        for (cid, idx, dialect, seg_i, reason, prefix_len, newp, comp, lps, vers, fin, q, g, e, flags, created) in rows:
            newp, comp, lps, vers = _unpack("i", newp), _unpack("i", comp), _unpack("d", lps), _unpack("i", vers)
            flags = json.loads(flags or "{}")
            seg = segs.get(seg_i)
            have = len(seg.token_ids) if seg is not None else 0
            if flags.get("detached"):  # in the record, in no segment: never trained on
                if prefix_len > have:
                    raise ValueError(f"session {sid} call {idx}: reuses {prefix_len} tokens but segment {seg_i} "
                                     f"has {have}: the store is inconsistent")
            else:
                if seg is None:
                    seg = segs[seg_i] = Segment([], [], [], [], split_reason=reason)
                    if flags.get("spawned_by"):
                        seg.spawned_by = _parent(flags["spawned_by"], segs)
                    if flags.get("compacted_from"):
                        seg.compacted_from = _parent(flags["compacted_from"], segs)
                        _label_summary(seg.compacted_from, segs)
                if prefix_len != have:
                    raise ValueError(f"session {sid} call {idx}: reuses {prefix_len} tokens but segment {seg_i} "
                                     f"has {have}: the store is inconsistent")
                n = len(newp)
                seg.token_ids += newp
                seg.loss_mask += [0] * n
                seg.logprobs += [0.0] * n
                seg.versions += [-1] * n
                seg.token_ids += comp
                seg.loss_mask += [1] * len(comp)
                seg.logprobs += lps
                seg.versions += vers
                seg.call_ids.append(cid)
            calls.append(CallRecord(call_id=cid, session_id=sid, index=idx, dialect=dialect,
                                    prompt_prefix_len=prefix_len, new_prompt_ids=newp, completion_ids=comp,
                                    logprobs=lps, versions=vers, finish_reason=fin, segment=seg_i, queue_s=q,
                                    gen_s=g, env_s=e, finished_at=created or 0.0, flags=flags))
        # segment indices are dense from 0 (the proxy numbers segments as they commit)
        order = {k: i for i, k in enumerate(sorted(segs))}
        for c in calls:
            c.segment = order.get(c.segment, c.segment)
        for seg in segs.values():
            for link in (seg.spawned_by, seg.compacted_from):
                if link is not None:
                    link["segment"] = order.get(link["segment"], link["segment"])
        meta, reward, status, term, task_id, harness, model, th = s
        return Trajectory(sid, [segs[k] for k in sorted(segs)], reward, status, term or "", task_id or "",
                          harness or "", model or "", th or "", calls, json.loads(meta or "{}"))

    # -- export ------------------------------------------------------------------------
    def export_jsonl(self, path: str | Path, session_ids: Iterable[str] | None = None) -> int:
        """One Trajectory (to_dict) per line; returns the number written."""
        ids = list(session_ids) if session_ids is not None else self.session_ids()
        with open(path, "w") as f:
            for sid in ids:
                f.write(self.trajectory(sid).to_json() + "\n")
        return len(ids)

    def export_parquet(self, path: str | Path, session_ids: Iterable[str] | None = None) -> int:
        """One row per segment with per-token list columns; returns the number of rows."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        ids = list(session_ids) if session_ids is not None else self.session_ids()
        cols: dict[str, list] = {k: [] for k in (
            "session_id", "segment", "split_reason", "token_ids", "loss_mask", "logprobs", "versions",
            "reward", "status", "termination", "task_id", "harness", "model", "chat_template_hash", "n_calls")}
        for sid in ids:
            t = self.trajectory(sid)
            for i, seg in enumerate(t.segments):
                for k, v in (("session_id", sid), ("segment", i), ("split_reason", seg.split_reason),
                             ("token_ids", seg.token_ids), ("loss_mask", seg.loss_mask),
                             ("logprobs", seg.logprobs), ("versions", seg.versions), ("reward", t.reward),
                             ("status", t.status), ("termination", t.termination), ("task_id", t.task_id),
                             ("harness", t.harness), ("model", t.model), ("chat_template_hash", t.chat_template_hash),
                             ("n_calls", len(seg.call_ids))):
                    cols[k].append(v)
        schema = pa.schema([("session_id", pa.string()), ("segment", pa.int32()), ("split_reason", pa.string()),
                            ("token_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                            ("logprobs", pa.list_(pa.float64())), ("versions", pa.list_(pa.int32())),
                            ("reward", pa.float64()), ("status", pa.string()), ("termination", pa.string()),
                            ("task_id", pa.string()), ("harness", pa.string()), ("model", pa.string()),
                            ("chat_template_hash", pa.string()), ("n_calls", pa.int32())])
        pq.write_table(pa.table(cols, schema=schema), str(path))
        return len(cols["session_id"])

    def close(self) -> None:
        with self._lock:
            self._db.close()
