"""The viewer's HTTP surface: a JSON API over the runs plus the static page that draws it.

Contract: `build_app(indexes, model=None)` serves `/` (the page, from `static/`, which loads
nothing from the network) and, per run `r` (its position on the command line):
`/api/runs`, `/api/runs/{r}/summary`, `/api/runs/{r}/filters`, `/api/runs/{r}/episodes`
(limit/offset paged, filtered and sorted in SQL), `/api/runs/{r}/episodes/{sid}` (the
header: outcome, grading, segments), `.../calls` (paged conversation) and `.../tokens`
(one segment's tokens, paged); `/api/compare/tasks` (episode outcomes per task across runs,
paged). Every list endpoint takes `limit` (1..500 or 1..20000 for tokens) and `offset`.
Bad input is a 400 whose body names the parameter (`{"error": ..., "param": ...}`), an
unknown run or episode a 404; never a traceback. `model` overrides the tokenizer the records
name.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from harnessrl.gym.trajectory import Trajectory
from harnessrl.gym.tools.viewer import curves, episode_view
from harnessrl.gym.tools.viewer.run_index import SORTABLE, RunIndex

STATIC = Path(__file__).with_name("static")
Sort = Literal[SORTABLE]  # type: ignore[valid-type]


class NotFound(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Runs:
    """The runs being viewed, and a small cache of opened trajectories."""

    def __init__(self, indexes: list[RunIndex], model: str | None):
        self.indexes, self.model = indexes, model
        self._trajs: OrderedDict[tuple, Trajectory] = OrderedDict()
        self._lock = threading.Lock()  # sync endpoints run in a thread pool

    def run(self, r: int) -> RunIndex:
        if not 0 <= r < len(self.indexes):
            raise NotFound(f"no run {r}: runs are 0..{len(self.indexes) - 1}")
        return self.indexes[r]

    def trajectory(self, r: int, sid: str) -> Trajectory:
        """The record, cached while the run's files are unchanged (a live episode is re-read)."""
        index = self.run(r)
        key = (r, sid, index.stamp())
        with self._lock:
            if key in self._trajs:
                self._trajs.move_to_end(key)
                return self._trajs[key]
        try:
            traj = index.trajectory(sid)
        except KeyError as e:
            raise NotFound(str(e.args[0])) from None
        with self._lock:
            self._trajs[key] = traj
            while len(self._trajs) > 8:
                self._trajs.popitem(last=False)
        return traj

    def decoder(self, traj: Trajectory) -> tuple[episode_view.Decoder | None, str | None]:
        name = self.model or traj.model
        if not name:
            return None, "the record names no model: tokens are shown as ids"
        try:
            return episode_view.decoder(name), None
        except (FileNotFoundError, KeyError, ValueError) as e:
            return None, f"tokens not decoded: {e}"


def _param(loc: tuple) -> str:
    return str(loc[-1]) if loc else "request"


async def bad_input(request: Request, exc: RequestValidationError) -> JSONResponse:
    err = exc.errors()[0]
    param = _param(tuple(err.get("loc", ())))
    return JSONResponse({"error": f"{param}: {err.get('msg', 'invalid')}", "param": param}, status_code=400)


async def not_found(request: Request, exc: NotFound) -> JSONResponse:
    return JSONResponse({"error": exc.message}, status_code=404)


class Api:
    """The page and the JSON API over the runs being viewed: one method per route (`ROUTES`)."""

    def __init__(self, runs: Runs):
        self.runs = runs

    def index(self) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    def list_runs(self) -> list[dict[str, Any]]:
        return [{"run": i, "name": ix.name, "root": str(ix.files.root),
                 "kind": "train" if ix.files.metrics else "rollout",
                 "episodes": ix.query("SELECT COUNT(*) FROM episodes")[0][0]} for i, ix in enumerate(self.runs.indexes)]

    def summary(self, r: int, max_points: int = Query(500, ge=2, le=5000)) -> dict[str, Any]:
        return curves.summary(self.runs.run(r), max_points)

    def filters(self, r: int) -> dict[str, list[str]]:
        ix = self.runs.run(r)
        return {c: ix.distinct(c) for c in ("harness", "status", "termination")}

    def episodes(self, r: int, limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0),
                 sort: Sort = "order", desc: bool = False, task: str | None = None, harness: str | None = None,
                 status: str | None = None, termination: str | None = None, split: str | None = None,
                 min_reward: float | None = None, max_reward: float | None = None) -> dict[str, Any]:
        return self.runs.run(r).episodes(limit, offset, sort, desc, task, harness, status, termination, split,
                                         min_reward, max_reward)

    def episode(self, r: int, sid: str) -> dict[str, Any]:
        traj = self.runs.trajectory(r, sid)
        dec, why = self.runs.decoder(traj)
        return dict(episode_view.header(traj), run=r, decoded_with=dec.model if dec else None, decode_note=why)

    def calls(self, r: int, sid: str, limit: int = Query(50, ge=1, le=500),
              offset: int = Query(0, ge=0)) -> dict[str, Any]:
        traj = self.runs.trajectory(r, sid)
        return episode_view.calls_page(traj, self.runs.decoder(traj)[0], offset, limit)

    def tokens(self, r: int, sid: str, segment: int = Query(0, ge=0), limit: int = Query(4000, ge=1, le=20000),
               offset: int = Query(0, ge=0)) -> Any:
        traj = self.runs.trajectory(r, sid)
        if segment >= len(traj.segments):
            return JSONResponse({"error": f"segment: episode {sid} has {len(traj.segments)} segment(s), "
                                          f"no segment {segment}", "param": "segment"}, status_code=400)
        return episode_view.token_page(traj, self.runs.decoder(traj)[0], segment, offset, limit)

    def compare_tasks(self, runs_: str = Query("", alias="runs"), limit: int = Query(100, ge=1, le=500),
                      offset: int = Query(0, ge=0)) -> Any:
        try:
            which = [int(x) for x in runs_.split(",") if x.strip()] or list(range(len(self.runs.indexes)))
        except ValueError:
            return JSONResponse({"error": f"runs: a comma-separated list of run numbers, got {runs_!r}",
                                 "param": "runs"}, status_code=400)
        per: dict[str, dict[int, dict[str, Any]]] = {}
        for r in which:
            for task, n, wins, mean in self.runs.run(r).query(
                    "SELECT task_id, COUNT(*), SUM(reward >= 1.0), AVG(reward) FROM episodes GROUP BY task_id"):
                per.setdefault(task, {})[r] = {"episodes": n, "successes": wins or 0, "reward_mean": mean}
        tasks = sorted(per)
        return {"runs": which, "total": len(tasks), "offset": offset, "limit": limit,
                "rows": [{"task_id": t, "by_run": {str(r): per[t].get(r) for r in which}}
                         for t in tasks[offset:offset + limit]]}


ROUTES = (
    ("/", "index"),
    ("/api/runs", "list_runs"),
    ("/api/runs/{r}/summary", "summary"),
    ("/api/runs/{r}/filters", "filters"),
    ("/api/runs/{r}/episodes", "episodes"),
    ("/api/runs/{r}/episodes/{sid}", "episode"),
    ("/api/runs/{r}/episodes/{sid}/calls", "calls"),
    ("/api/runs/{r}/episodes/{sid}/tokens", "tokens"),
    ("/api/compare/tasks", "compare_tasks"),
)
"""(path, `Api` method) of every GET route, in the order they are matched."""


def build_app(indexes: list[RunIndex], model: str | None = None) -> FastAPI:
    api = Api(Runs(indexes, model))
    app = FastAPI(title="harnessrl view", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_exception_handler(RequestValidationError, bad_input)
    app.add_exception_handler(NotFound, not_found)
    for path, name in ROUTES:
        app.get(path)(getattr(api, name))
    return app
