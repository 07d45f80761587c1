"""`harnessrl sessions list|show|new|delete|purge` and `harnessrl feedback SID --reward R [--note N]`.

Each command works on the store folder (`--store`, default `serve.default_store()`). While a
`harnessrl serve` runs on it (its serve.json answers), new sessions, feedback and deletion go
through that server's admin API, so a session is never deleted under a call that is still
recording; otherwise they act on the store file directly. Both ways validate feedback the
same way (`feedback.parse_feedback`) and verify a deletion (`Store.delete_session`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from harnessrl.gym.live.feedback import FeedbackError, parse_feedback, record_feedback
from harnessrl.gym.live.privacy import DB_NAME, private_dir
from harnessrl.gym.live.serve import default_store, env_lines, live_meta, server_file
from harnessrl.gym.proxy.store import Store


class LiveError(Exception):
    """A refused command; the message says why (unknown session, bad feedback, no server)."""


def running_server(store: str) -> dict[str, Any] | None:
    """serve.json of the server running on `store`, if one is there and answers its admin API."""
    f = server_file(store)
    if not f.exists():
        return None
    info = json.loads(f.read_text())
    try:
        r = httpx.get(f"{info['url']}/admin/stats", headers={"Authorization": f"Bearer {info['admin_token']}"},
                      timeout=5)
    except httpx.HTTPError:
        return None  # a server that was killed left its file: act on the store
    return info if r.status_code == 200 else None


def _admin(info: dict[str, Any], method: str, path: str, **kw: Any) -> dict[str, Any]:
    r = httpx.request(method, f"{info['url']}{path}", headers={"Authorization": f"Bearer {info['admin_token']}"},
                      timeout=120, **kw)
    if r.status_code >= 400:
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text[:300]
        raise LiveError(msg)
    return r.json()


def _store(store: str) -> Store:
    folder = Path(store).expanduser()
    if not (folder / DB_NAME).exists():
        raise LiveError(f"no live store in {folder} (start one with `harnessrl serve --store {store}`)")
    return Store(str(private_dir(folder) / DB_NAME))


def give_feedback(store: str, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    """Record feedback for `sid` (through the running server, else in the store)."""
    try:
        fb = parse_feedback(body)
    except FeedbackError as e:
        raise LiveError(str(e)) from None
    info = running_server(store)
    if info is not None:
        return _admin(info, "POST", f"/admin/sessions/{sid}/feedback", json=body)
    st = _store(store)
    try:
        return record_feedback(st, sid, fb)
    except KeyError:
        raise LiveError(f"unknown session {sid!r} in {store}") from None
    finally:
        st.close()


def delete(store: str, sid: str) -> dict[str, Any]:
    """Remove `sid` from disk and verify it (through the running server, else in the store)."""
    info = running_server(store)
    if info is not None:
        return _admin(info, "DELETE", f"/admin/sessions/{sid}")
    st = _store(store)
    try:
        return st.delete_session(sid)
    except KeyError:
        raise LiveError(f"unknown session {sid!r} in {store}") from None
    finally:
        st.close()


def new_session(store: str, label: str) -> tuple[str, str, str]:
    """(url, session id, key) of a new session on the running server."""
    info = running_server(store)
    if info is None:
        raise LiveError(f"no `harnessrl serve` is running on {store}: a session needs one to record into")
    d = _admin(info, "POST", "/admin/sessions", json={"meta": live_meta(label, info["tokenizer_hash"])})
    return info["url"], d["session_id"], d["key"]


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _cmd(a: argparse.Namespace) -> int:
    if a.cmd == "feedback":
        out = give_feedback(a.store, a.session, {"reward": a.reward, "note": a.note})
        print(f"session {out['session_id']}: reward {out['reward']:g} recorded, session closed")
        return 0
    if a.action == "new":
        url, sid, key = new_session(a.store, a.label)
        print(f"# harnessrl live session {sid}\n{env_lines(url, sid, key)}")
        return 0
    if a.action == "purge":  # retention: every session created before the cut-off
        if a.older_than_days is None:
            raise LiveError("purge needs --older-than-days N")
        cut = time.time() - a.older_than_days * 86400
        st = _store(a.store)
        try:
            old = [r["session_id"] for r in st.summaries() if r["created"] < cut]
        finally:
            st.close()
        outs = [delete(a.store, sid) for sid in old]
        bad = [o["session_id"] for o in outs if not o["verified"]]
        print(f"purged {len(outs)} sessions created over {a.older_than_days:g} days ago"
              + (f"; NOT verified: {', '.join(bad)}" if bad else "; verified: their ids are in no file of the store"))
        return 1 if bad else 0
    if a.action == "delete":
        out = delete(a.store, a.session)
        state = "verified: its id is in no file of the store" if out["verified"] else \
            f"NOT verified: its id is still in {', '.join(out['still_in'])}"
        print(f"session {a.session}: deleted ({out['calls_deleted']} calls); {state}")
        return 0 if out["verified"] else 1
    st = _store(a.store)
    try:
        rows = st.summaries()
        if a.action == "list":
            print(f"{'session':<18} {'created':<21} {'calls':>5} {'reward':>6} {'status':<8} harness")
            for r in rows:
                rew = "-" if r["reward"] is None else f"{r['reward']:.2f}"
                print(f"{r['session_id']:<18} {_when(r['created']):<21} {r['calls']:>5} {rew:>6} {r['status']:<8} "
                      f"{r['harness']}")
            return 0
        row = next((r for r in rows if r["session_id"] == a.session), None)
        if row is None:
            raise LiveError(f"unknown session {a.session!r} in {a.store}")
        traj = st.trajectory(a.session)
        print(json.dumps(row | {"segments": len(traj.segments),
                                "sampled_tokens": sum(sum(s.loss_mask) for s in traj.segments),
                                "tokens": sum(len(s.token_ids) for s in traj.segments)}, indent=2))
        return 0
    finally:
        st.close()


def build_parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sessions", help="list, show, open or delete live sessions")
    p.add_argument("action", choices=["list", "show", "new", "delete", "purge"])
    p.add_argument("session", nargs="?", help="session id (show, delete)")
    p.add_argument("--label", default="", help="new: a name for the harness process (shown in list)")
    p.add_argument("--older-than-days", type=float, default=None,
                   help="purge: delete every session created more than this many days ago (retention)")
    p = sub.add_parser("feedback", help="a live session's reward in [0, 1] (closes the session)")
    p.add_argument("session")
    p.add_argument("--reward", type=float, required=True)
    p.add_argument("--note", default="")
    for p in sub.choices.values():
        p.add_argument("--store", default=default_store(), help="the live store folder (harnessrl serve --store)")
    return ap


def main(argv: list[str]) -> int:
    """`argv` starts with the command: ["sessions", "list"] or ["feedback", SID, "--reward", "1"]."""
    a = build_parser("harnessrl").parse_args(argv)
    if a.cmd == "sessions" and a.action in ("show", "delete") and not a.session:
        print(f"harnessrl sessions {a.action}: which session? (harnessrl sessions list)", file=sys.stderr)
        return 2
    try:
        return _cmd(a)
    except LiveError as e:
        print(f"harnessrl {a.cmd}: {e}", file=sys.stderr)
        return 2
