"""Two proxies serve one run (`rollout.proxies = 2`, `gym.proxies`): `harnessrl train` with the
in-process proxy and one proxy process, real Docker sandboxes, the real tiny-agent harness and
the local engine on the random-init tiny-llama (its replies carry no tool call: each episode is
one call, submitted, reward 0.0; `zero_variance = "keep"` trains on them, so each step is a real
update, weight sync and publish). Step 1's two episodes land one in each store and are both
trained on; in step 2 the proxy process is SIGKILLed while its episode's first model call waits
in front of the engine: that episode ends masked `proxy_lost`, the other is scored, the run
completes. The viewer's HTTP API and `export` read both stores as one run (`stores.json`); no
proxy process outlives the run, even one whose parent is killed."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend, train_in_thread, until  # noqa: E402

from harnessrl.gym.proxy.run_stores import RunStoresError, read_index, session_ids, session_owners  # noqa: E402

TASK = "harnessrl-builtin__calc-1"
TINY_AGENT = str(Path(__file__).resolve().parents[1] / "examples/harnesses/tiny-agent.toml")


class HeldEngine:
    """An ASGI front of a real engine: every request is forwarded as it came; the first `free`
    `/generate` calls carrying the episodes' first prompt (tiny-agent's first request depends
    only on its task) pass at once, later ones wait until `open` is set (`waiting` counts them)."""

    def __init__(self, upstream: str, free: int):
        self.upstream, self.free, self.open = upstream, free, threading.Event()
        self.first: list[int] | None = None
        self.firsts = self.waiting = 0
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            msg = await receive()
            body, more = body + msg.get("body", b""), msg.get("more_body", False)
        if scope["path"] == "/generate":
            ids = json.loads(body).get("input_ids")
            with self._lock:
                self.first = ids if self.first is None else self.first
                held = ids == self.first and self.firsts >= self.free
                self.firsts += ids == self.first
                self.waiting += held
            while held and not self.open.is_set():
                await asyncio.sleep(0.05)
        query = scope.get("query_string", b"").decode()
        async with httpx.AsyncClient(base_url=self.upstream, timeout=None) as client:
            r = await client.request(scope["method"], scope["path"] + (f"?{query}" if query else ""), content=body,
                                     headers={"content-type": "application/json"})
        await send({"type": "http.response.start", "status": r.status_code,
                    "headers": [(b"content-type", r.headers.get("content-type", "application/json").encode())]})
        await send({"type": "http.response.body", "body": r.content})


def _gone(pid: int) -> bool:
    """The process has exited (no /proc entry, or a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    """One two-step train run on two proxies, proxy 1 killed in step 2 (module doc)."""
    docker_backend()
    from harnessrl.gym.served import ServedApp
    from harnessrl.trainers.engine import EngineServer
    from harnessrl.trainers.loop import TrainConfig

    out = tmp_path_factory.mktemp("fleet")
    engine = EngineServer(model="tiny-llama", port=0, weight_version="0", num_threads=2).start()
    gate = HeldEngine(engine.url, free=2)  # step 1's two episodes pass; step 2's wait
    with ServedApp(gate) as served:
        cfg = TrainConfig.model_validate({
            "model": "tiny-llama", "steps": 2, "out_dir": str(out), "progress": False, "tensorboard": False,
            "stages": ["rl"], "eval": {"points": []}, "engine_url": served.url,
            "rollout": {"harness": TINY_AGENT, "suite": "builtin", "tasks": [TASK], "sandbox": "docker",
                        "sandbox_pool_size": 2, "proxies": 2, "max_new_tokens": 32,
                        "episode": {"max_calls": 2, "wall_time_s": 120}},
            "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 0},
            "trainer": {"lr": 1e-5, "device": "cpu"},
            "sampling": {"zero_variance": "keep"},  # the tiny model's rewards are all 0: train on them anyway
        })
        runner, results = train_in_thread(cfg)
        until(lambda: gate.waiting >= 2 or not runner.is_alive(), "step 2's episodes waiting for the engine")
        if not runner.is_alive():
            raise results.get("error") or AssertionError(f"the run ended before step 2's episodes waited: {results}")
        index = json.loads((out / "rollouts" / "stores.json").read_text())["stores"]
        results["index"] = index
        results["alive_before_kill"] = not _gone(index[1]["pid"])
        os.kill(index[1]["pid"], signal.SIGKILL)  # proxy 1 dies under its episode
        gate.open.set()
        runner.join(timeout=500)
    engine.stop()
    assert not runner.is_alive(), "train did not finish"
    if "error" in results:
        raise results["error"]
    return out, results


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_two_proxies_serve_one_train_run_and_a_lost_one_masks_only_its_episode(fleet_run):
    out, res = fleet_run
    history, index = res["history"], res["index"]
    assert res["alive_before_kill"]
    assert [(e["path"], e["proxy"]) for e in index] == [("trajectories.db", 0), ("proxies/1/trajectories.db", 1)]
    assert index[0]["pid"] == os.getpid() and index[1]["pid"] != os.getpid()
    assert all(_gone(e["pid"]) for e in index[1:])  # no proxy process outlives the run
    stores = read_index(out / "rollouts")
    assert stores == [out / "rollouts" / "trajectories.db", out / "rollouts" / "proxies/1/trajectories.db"]
    owners = session_owners(stores)
    s0, s1 = session_ids(stores[0]), session_ids(stores[1])
    assert len(s0) == 2 and len(s1) == 2 and not set(s0) & set(s1)  # each step put one episode on each

    lines = [json.loads(x) for x in (out / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and {t["session_id"] for t in lines} == set(owners)
    step1, step2 = lines[:2], lines[2:]  # staleness 0: step 2's group starts after step 1's is trained on
    # Step 1: one episode on each proxy, both scored (the random tiny model answers without a tool
    # call: submitted, 0.0), and the trainer's step trained on both, then published version 1
    # through a weight sync that paused both proxies.
    assert {owners[t["session_id"]] for t in step1} == set(stores)
    assert [(t["reward"], t["termination"], len(t["calls"])) for t in step1] == [(0.0, "submitted", 1)] * 2
    first, second = history
    assert first["batch_report"]["endings"] == {"submitted": 2} and first["masked_infra"] == 0
    assert (first["updated"], first["version"], first["trajectories"], first["samples"], first["tokens"]) == \
        (True, 1, 2, 2, 2 * 32)
    # Step 2: proxy 1's episode masked with the reason, proxy 0's scored; the run went on and
    # published version 2 (the lost proxy skipped by the sync's pause and the publish).
    lost = next(t for t in step2 if owners[t["session_id"]] == stores[1])
    kept = next(t for t in step2 if owners[t["session_id"]] == stores[0])
    assert (lost["reward"], lost["status"], lost["termination"], lost["calls"]) == (None, "infra_error", "proxy_lost", [])
    assert lost["metadata"]["error"].startswith(
        f"trajectory fetch: ProxyUnreachable: the proxy at {index[1]['url']} is unreachable (POST /admin/sessions/")
    assert (kept["reward"], kept["status"], kept["termination"]) == (0.0, "ok", "submitted")
    assert {v for seg in kept["segments"] for v in seg["versions"] if v >= 0} == {1}  # sampled after the publish
    assert (second["masked_infra"], second["trajectories"], second["updated"], second["version"]) == (1, 1, True, 2)
    assert second["batch_report"]["endings"] == {"proxy_lost": 1, "submitted": 1}
    assert [f["termination"] for f in second["batch_report"]["failures"]] == ["proxy_lost"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_the_viewer_and_export_read_both_stores_as_one_run(fleet_run, tmp_path):
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tools.formats.export import ExportError, export
    from harnessrl.gym.tools.viewer.app import build_app
    from harnessrl.gym.tools.viewer.run_index import RunFolderError, RunIndex

    out, _ = fleet_run
    stores = read_index(out / "rollouts")
    owners = session_owners(stores)
    jsonl = {t["session_id"]: t for t in map(json.loads, (out / "rollouts/trajectories.jsonl").read_text().splitlines())}
    # The stores alone (a run killed before its JSONL was written): the index and the stores, WAL files included.
    bare = tmp_path / "bare"
    shutil.copytree(out / "rollouts", bare, ignore=shutil.ignore_patterns("trajectories.jsonl", "*.sock"))
    for run in (out, bare):
        with ServedApp(build_app([RunIndex(run)], model="tiny-llama")) as viewer:
            listed = httpx.get(f"{viewer.url}/api/runs/0/episodes", params={"limit": 50}, timeout=30).json()
            assert listed["total"] == 4 and {r["sid"] for r in listed["rows"]} == set(owners)
            for store in stores:  # open one scored episode from each store
                sid = next(s for s, at in owners.items() if at == store and jsonl[s]["reward"] == 0.0)
                ep = httpx.get(f"{viewer.url}/api/runs/0/episodes/{sid}", timeout=30).json()
                assert (ep["session_id"], ep["reward"], ep["termination"]) == (sid, 0.0, "submitted")
                assert ep["n_calls"] == 1 and ep["segments"][0]["sampled"] == 32
                assert ep["n_calls"] == len(jsonl[sid]["calls"])
                assert [s["n_tokens"] for s in ep["segments"]] == [len(s["token_ids"]) for s in jsonl[sid]["segments"]]
    for run, name in ((out, "with-jsonl.jsonl"), (bare, "stores-only.jsonl")):
        assert export(run, "jsonl", tmp_path / name) == 4
        got = {t["session_id"]: t for t in map(json.loads, (tmp_path / name).read_text().splitlines())}
        assert set(got) == set(owners)
        scored = [s for s in owners if jsonl[s]["reward"] == 0.0]
        assert len(scored) == 3 and all(got[s]["reward"] == 0.0 for s in scored)
        assert all(got[s]["segments"][0]["token_ids"] == jsonl[s]["segments"][0]["token_ids"] for s in scored)
    # A store that is not this run's (a session id in two stores) is refused, naming both.
    clash = tmp_path / "clash"
    shutil.copytree(bare, clash)
    for suffix in ("", "-wal", "-shm"):
        src = clash / f"trajectories.db{suffix}"
        dst = clash / f"proxies/1/trajectories.db{suffix}"
        dst.unlink(missing_ok=True)
        if src.exists():
            shutil.copy(src, dst)
    with pytest.raises(RunFolderError, match=r"is in two stores of run .*trajectories.db and .*proxies/1/trajectories.db"):
        RunIndex(clash)
    with pytest.raises(ExportError, match=r"is in two stores of one run"):
        export(clash, "jsonl", tmp_path / "x.jsonl")


def test_a_fleet_pins_episodes_to_the_least_busy_proxy_and_reaches_every_proxy(tmp_path):
    """Two proxies in front of a stand-in engine: leases alternate and follow load; a version, a
    pause and a resume reach both; a hung process is killed and lost, then takes no episode and
    is skipped."""
    from harnessrl.gym.doubles.standin import StandinEngine
    from harnessrl.gym.proxies import ProxyFleet
    from harnessrl.gym.proxy import ProxyConfig, ProxyServer
    from harnessrl.gym.served import ServedApp

    with ServedApp(StandinEngine().app()) as eng:
        cfg = ProxyConfig(engine_url=eng.url, model="tiny-llama", db_path=str(tmp_path / "trajectories.db"))
        with ProxyFleet(ProxyServer(cfg), 1, tmp_path, admin_timeout_s=2.0) as fleet:
            local, child = fleet.members
            with fleet.lease() as a, fleet.lease() as b, fleet.lease() as c:
                assert [h.url for h in (a, b, c)] == [local.url, child.url, local.url]
                assert (b.admin_token, b.uds_path) == (child.admin_token, str(tmp_path / "proxies/1/proxy.sock"))
                assert b.engine_url == eng.url and fleet.episodes == [2, 1]
                with fleet.lease() as d:
                    assert d.url == child.url  # the least busy
            assert fleet.episodes == [0, 0]
            fleet.set_policy_version(7)
            fleet.pause()
            both = [local.stats(), child.admin("/admin/stats", method="GET")]
            assert [(s["policy_version"], s["paused"]) for s in both] == [(7, True), (7, True)]
            fleet.resume()
            assert [p["in_service"] for p in fleet.stats()["proxies"]] == [True, True]
            assert child.admin("/admin/stats", method="GET")["paused"] is False
            os.kill(child.pid, signal.SIGSTOP)  # hung: it holds its port but answers nothing
            fleet.set_policy_version(8)  # no answer within admin_timeout_s: killed and lost, not a hang or an error
            assert child.proc.wait() == -9 and local.stats()["policy_version"] == 8
            assert fleet.lost[1].startswith("its admin call /admin/policy_version failed (ReadTimeout")
            assert fleet.lost[1].endswith("; it was killed")
            with fleet.lease() as e, fleet.lease() as f:
                assert e.url == f.url == local.url
            assert [(p["proxy"], p["in_service"]) for p in fleet.stats()["proxies"]] == [(0, True), (1, False)]
        assert json.loads((tmp_path / "stores.json").read_text())["stores"][1]["path"] == "proxies/1/trajectories.db"
        assert child.proc.returncode == -9


def test_a_store_index_lists_only_files_inside_its_run(tmp_path):
    from harnessrl.gym.proxy.run_stores import write_index
    from harnessrl.gym.tools.viewer.run_index import RunFiles, RunFolderError

    (tmp_path / "trajectories.db").write_bytes(b"")
    for bad, why in (("../elsewhere.db", "must be relative to the run folder and stay inside it"),
                     ("/etc/passwd", "must be relative to the run folder and stay inside it"),
                     ("proxies/9/trajectories.db", "is not a file in")):
        (tmp_path / "stores.json").write_text(json.dumps({"stores": [{"path": "trajectories.db"}, {"path": bad}]}))
        with pytest.raises(RunStoresError, match=rf"stores\[1\]\.path: .*{why}"):
            read_index(tmp_path)
        with pytest.raises(RunFolderError, match=r"stores\[1\]\.path"):
            RunFiles.find(tmp_path)
    (tmp_path / "stores.json").write_text('{"stores": []}')
    with pytest.raises(RunStoresError, match="lists no store"):
        read_index(tmp_path)
    with pytest.raises(ValueError, match="must be relative"):
        write_index(tmp_path, [{"path": "../x.db"}])
    (tmp_path / "stores.json").unlink()
    assert read_index(tmp_path) is None  # one proxy: no index, the one store as before
    files = RunFiles.find(tmp_path)
    assert files.store == tmp_path / "trajectories.db" and files.stores == (tmp_path / "trajectories.db",)


_PARENT = """
import json, sys, time
from pathlib import Path
from harnessrl.gym.proxies import ProxyFleet
from harnessrl.gym.proxy import ProxyConfig, ProxyServer
cfg = ProxyConfig(engine_url=["http://127.0.0.1:9", "http://127.0.0.1:10"], model="tiny-llama", host="0.0.0.0",
                  admin_clients="any", db_path=sys.argv[1] + "/trajectories.db")
fleet = ProxyFleet(ProxyServer(cfg), 1, sys.argv[1]).start()
child = fleet.members[1]
print(json.dumps({"url": child.url, "pid": child.pid, "token": child.admin_token}), flush=True)
time.sleep(600)
"""


def _own_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outbound interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.timeout(180)
def test_a_proxy_process_off_loopback_wants_its_token_and_dies_with_its_parent(tmp_path):
    """A run's extra proxy bound to every interface with `admin_clients = "any"`: from a
    non-loopback address its admin API answers 401 without the token or with a wrong one, 400
    (naming the field) for bad values, and 200 with the token; its token is in neither its
    command line nor its environment.
    Its parent SIGKILLed, it exits too (its stdin closed)."""
    import harnessrl

    here = str(Path(harnessrl.__file__).parent.parent)  # the parent imports this harnessrl
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        said = json.loads(parent.stdout.readline())
        pid, token = said["pid"], said["token"]
        for shown in ("cmdline", "environ"):  # handed over on its stdin: in no /proc file
            assert token.encode() not in Path(f"/proc/{pid}/{shown}").read_bytes()
        ip = _own_address()
        base = said["url"].replace("0.0.0.0", ip or "127.0.0.1")
        with httpx.Client(base_url=base, timeout=30) as c:
            auth = {"Authorization": f"Bearer {token}"}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}, {"Authorization": ""}):
                r = c.get("/admin/stats", headers=headers)
                assert r.status_code == 401 and r.json()["error"]["message"] == "invalid admin token"
            assert c.post("/admin/pause", headers={"Authorization": "Bearer x" + token}).status_code == 401
            assert c.get("/admin/stats", headers=auth).json()["sessions"] == 0
            r = c.post("/admin/lora", headers=auth, json={"name": 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == "name"
            r = c.post("/admin/engines", headers=auth, json={"urls": "http://127.0.0.1:9"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "urls"
            r = c.post("/admin/engines", headers=auth, json={"urls": ["http://evil:1"]})
            assert r.status_code == 400 and "not engines of this router" in r.json()["error"]["message"]
            assert c.post("/admin/engines", headers=auth, json={"urls": ["http://127.0.0.1:9"]}).json() == {"applied": True}
            engines = c.get("/admin/stats", headers=auth).json()["engines"]
            assert [(e["url"], e["in_service"]) for e in engines] == [("http://127.0.0.1:9", True),
                                                                      ("http://127.0.0.1:10", False)]
            assert c.post("/admin/lora", headers=auth, json={"name": "policy"}).json() == {"applied": True}
            assert c.post("/admin/policy_version", headers=auth, json={"version": -1}).status_code == 400
        parent.kill()  # SIGKILL: no cleanup runs in the parent
        parent.wait()
        until(lambda: _gone(pid), "the orphaned proxy process exits", limit_s=60)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_extra_proxies_need_an_engine_url_and_local_placement():
    from harnessrl.gym.proxies import ProxyFleet
    from harnessrl.gym.proxy import ProxyConfig, ProxyServer
    from harnessrl.trainers.train_config import TrainConfig

    with pytest.raises(ValueError, match="rollout.proxies: 3 proxies need an engine URL"):
        ProxyFleet(ProxyServer(ProxyConfig(engine_url="", model="tiny-llama")), 2, "/nonexistent")
    with pytest.raises(ValueError, match=r"rollout.proxies: 2 proxies serve episodes of placement \"local\""):
        TrainConfig.model_validate({"placement": "ray", "rollout": {"proxies": 2}})
    with pytest.raises(ValueError, match="admin_token: 3 characters is guessable"):
        ProxyConfig(engine_url="x", admin_clients="any", admin_token="abc")
    assert ProxyConfig(engine_url="x", admin_token="abc").admin_token == "abc"  # loopback only: as before
