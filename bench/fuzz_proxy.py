"""Fuzz the proxy with malformed requests and measure what one huge request costs the others.

    .venv/bin/python bench/fuzz_proxy.py [--n 5400] [--seed 0] [--quick]

The proxy and an instant stand-in engine run as their own processes (the engine refuses
prompts beyond a 32k-token context, as a real one does). Two parts, one run:

  fuzz      N seeded structured mutations (tests/proxy_fuzz_cases.py) of the real harness
            request shapes in tests/fixtures/harness-requests (Chat Completions, Responses,
            Anthropic Messages, Gemini; about half streamed) and of the admin API's bodies, over
            keep-alive connections. Every bad request is followed by a good one on the same
            connection. Counted: answers by status code, 5xx, hangs (no answer within the
            per-request timeout), resets (connection closed or broken), error events inside
            a 200, 400s that name no field, good follow-ups that failed.
  big       K sessions send small calls in a closed loop: their latency p99 alone (5 s windows
            before, between and after) and while 7.5 MB requests (each a new text: nothing
            cached) are parsed, rendered, tokenized and refused by the engine, one at a time.
            Target: p99 under the big requests <= 2x p99 alone.

Ends with ONE JSON line; `target_met` = N >= 5000 and 0 x 5xx, 0 hangs, 0 resets, no other
problem, and p99 ratio <= 2.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
from proxy_fuzz_cases import (DIALECT_PATHS, GOOD, Case, admin_case, admin_problems,  # noqa: E402
                              base_bodies, mutate, problems)
from proxy_overhead import admin, free_port, read_response, wait_http  # noqa: E402

PY = sys.executable


class Reset(Exception):
    """The server closed or broke the connection instead of answering."""


class Conn:
    """One keep-alive HTTP/1.1 connection (a minimal client: its CPU would crowd 2 cores)."""

    def __init__(self, port: int, auth: str):
        self.port, self.auth = port, auth
        self.r = self.w = None
        self.opened = 0

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port, limit=2 ** 24)
            self.opened += 1
        try:
            self.w.write((f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Authorization: Bearer {self.auth}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                         + body)
            await self.w.drain()
            status, data, close = await read_response(self.r)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            self.close()
            raise Reset(f"{type(e).__name__}: {e}") from None
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


# -- part 1: fuzz --------------------------------------------------------------------------------
async def fuzz(port: int, token: str, n: int, conc: int, seed: int, timeout: float) -> dict:
    bases = {d: base_bodies(d) for d in DIALECT_PATHS}
    by_status: collections.Counter = collections.Counter()
    found: dict[str, list[str]] = collections.defaultdict(list)
    counts = collections.Counter()
    per_kind = collections.Counter()

    def note(kind: str, text: str) -> None:
        counts[kind] += 1
        if len(found[kind]) < 5:
            found[kind].append(text[:300])

    async def call(conn: Conn, method: str, path: str, body: bytes = b"") -> tuple[int, bytes] | None:
        try:
            return await asyncio.wait_for(conn.request(method, path, body), timeout)
        except asyncio.TimeoutError:
            conn.close()
            note("hangs", f"{method} {path}")
        except Reset as e:
            note("resets", f"{method} {path}: {e}")
        return None

    async def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        sess = {}
        for d in DIALECT_PATHS:
            s = admin(port, token, "/admin/sessions", {"meta": {"harness": f"fuzz-{d}"}})
            sess[d] = (Conn(port, s["key"]), f"/s/{s['session_id']}")
        adm = Conn(port, token)
        admin_sid = admin(port, token, "/admin/sessions", {"meta": {"harness": "fuzz-admin"}})["session_id"]
        for i in range(w, n, conc):
            kind = rng.choices(["openai_chat", "openai_responses", "anthropic_messages", "gemini", "admin"],
                               [3, 3, 3, 3, 1])[0]
            per_kind[kind] += 1
            if kind == "admin":
                method, path, body, what = admin_case(rng, admin_sid)
                got = await call(adm, method, path, body)
                if got is None:
                    continue
                by_status[got[0]] += 1
                for p in admin_problems(got[0], got[1].decode("utf-8", "replace")):
                    note("5xx" if "admin 5" in p else "bad_shape", f"{what}: {p}")
                opened = adm.opened
                follow = await call(adm, "GET", "/admin/stats")
                if follow is None or follow[0] != 200 or adm.opened != opened:
                    note("follow_up_failed", f"after {what}: {follow and follow[0]}")
                continue
            conn, prefix = sess[kind]
            case: Case = mutate(kind, bases[kind], rng)
            got = await call(conn, "POST", prefix + case.path, case.content())
            if got is None:
                continue
            by_status[got[0]] += 1
            for p in problems(kind, case, got[0], {}, got[1].decode("utf-8", "replace")):
                k = ("5xx" if p[0] == "5" else "error_in_200" if "error" in p and got[0] == 200
                     else "unnamed_400" if "names no field" in p else "bad_shape")
                note(k, f"{kind} {case.note}: {p}")
            opened = conn.opened
            follow = await call(conn, "POST", prefix + DIALECT_PATHS[kind], json.dumps(GOOD[kind]).encode())
            if follow is None or follow[0] != 200 or conn.opened != opened:
                note("follow_up_failed", f"after {kind} {case.note}: {follow and follow[0]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(conc)))
    wall = time.perf_counter() - t0
    return {"requests": sum(per_kind.values()), "per_kind": dict(per_kind),
            "by_status": {str(k): v for k, v in sorted(by_status.items())},
            **{k: counts[k] for k in ("5xx", "hangs", "resets", "error_in_200", "unnamed_400", "bad_shape",
                                      "follow_up_failed")},
            "examples": dict(found), "wall_s": round(wall, 1)}


# -- part 2: one huge request among small ones --------------------------------------------------------
def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


async def big_request(port: int, token: str, k: int, base_s: float, n_big: int, size: int, timeout: float) -> dict:
    small = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi, list the files"}]}).encode()
    conns = []
    for _ in range(k):
        s = admin(port, token, "/admin/sessions", {"meta": {"harness": "small"}})
        conns.append((Conn(port, s["key"]), f"/s/{s['session_id']}/v1/chat/completions"))
    big_s = admin(port, token, "/admin/sessions", {"meta": {"harness": "big"}})
    big_conn, big_path = Conn(port, big_s["key"]), f"/s/{big_s['session_id']}/v1/chat/completions"
    lat: list[tuple[float, float]] = []
    phase = {"stop": False}
    errors = collections.Counter()

    async def loop(conn: Conn, path: str) -> None:
        while not phase["stop"]:
            t = time.perf_counter()
            try:
                st, _ = await asyncio.wait_for(conn.request("POST", path, small), timeout)
            except (asyncio.TimeoutError, Reset) as e:
                errors[type(e).__name__] += 1
                conn.close()
                continue
            if st != 200:
                errors[str(st)] += 1
            lat.append((t, time.perf_counter() - t))

    words = "the quick brown fox jumps over a lazy dog while tests run in the sandbox "
    bodies = []  # built before the clock starts: encoding 7.5 MB would stall this load generator too
    for i in range(n_big):
        text = f"request {i} {random.random()}: " + words * (size // len(words))
        bodies.append(json.dumps({"model": "policy", "messages": [{"role": "user", "content": text}]}).encode())
    tasks = [asyncio.ensure_future(loop(c, p)) for c, p in conns]
    await asyncio.sleep(1.0)  # warm-up
    # Baseline windows interleave with the big requests (base, big, base, big, ..., base):
    # the machine's own load drifts, and pairing keeps that drift out of the ratio.
    windows: list[tuple[str, float, float]] = []
    big = []
    for body in bodies + [None]:
        t = time.perf_counter()
        await asyncio.sleep(base_s)
        windows.append(("base", t, time.perf_counter()))
        if body is None:
            break
        t = time.perf_counter()
        try:
            st, data = await asyncio.wait_for(big_conn.request("POST", big_path, body), timeout * 4)
        except (asyncio.TimeoutError, Reset) as e:
            st, data = type(e).__name__, b""
            big_conn.close()
        windows.append(("big", t, time.perf_counter()))
        big.append({"status": st, "s": round(time.perf_counter() - t, 2), "bytes": len(body),
                    "answer": data[:160].decode("utf-8", "replace")})
    phase["stop"] = True
    await asyncio.gather(*tasks)

    def within(kind: str) -> list[float]:
        return [d for t, d in lat if any(k == kind and a <= t < b for k, a, b in windows)]
    base, under = within("base"), within("big")
    return {"sessions": k, "base_calls": len(base), "under_big_calls": len(under),
            "p50_base_ms": round(statistics.median(base) * 1e3, 2) if base else None,
            "p99_base_ms": round(_p99(base) * 1e3, 2), "p50_big_ms": round(statistics.median(under) * 1e3, 2)
            if under else None, "p99_big_ms": round(_p99(under) * 1e3, 2), "max_big_ms": round(max(under) * 1e3, 2)
            if under else None, "p99_ratio": round(_p99(under) / _p99(base), 2) if base and under else None,
            "big_requests": big, "small_errors": dict(errors)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5400, help="generated requests (target: >= 5000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conc", type=int, default=8, help="concurrent fuzz connections")
    ap.add_argument("--timeout", type=float, default=30.0, help="per-request timeout: past it, a hang")
    ap.add_argument("--big-mb", type=float, default=7.5)
    ap.add_argument("--big-n", type=int, default=4, help="huge requests, one at a time")
    ap.add_argument("--sessions", type=int, default=4, help="sessions sending small calls meanwhile")
    ap.add_argument("--quick", action="store_true", help="500 requests, one big one (a smoke run)")
    ap.add_argument("--no-fuzz", action="store_true", help="only the big-request part (target_met stays false)")
    a = ap.parse_args()
    if a.quick:
        a.n, a.big_n = 500, 1
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-bench-"))
    try:
        eport = free_port()
        procs.append(subprocess.Popen([PY, "-m", "harnessrl.gym.doubles.standin", "--port", str(eport),
                                       "--max-context", "32768"], cwd=ROOT))
        wait_http(eport, "/health", 60, procs[-1])
        pport, token = free_port(), "fuzz-admin"
        pp = subprocess.Popen([PY, "-m", "harnessrl.gym.proxy", "--engine-url", f"http://127.0.0.1:{eport}",
                               "--port", str(pport), "--db", str(tmp / "fuzz.db"), "--admin-token", token,
                               "--served-model", "policy", "--served-model", "probe-model"],
                              cwd=ROOT, stdout=subprocess.PIPE)
        procs.append(pp)
        json.loads(pp.stdout.readline())
        f = asyncio.run(fuzz(pport, token, 0 if a.no_fuzz else a.n, a.conc, a.seed, a.timeout))
        print(f"fuzz: {f['requests']} requests in {f['wall_s']} s, by status {f['by_status']}; 5xx {f['5xx']}, "
              f"hangs {f['hangs']}, resets {f['resets']}, error-in-200 {f['error_in_200']}, unnamed 400 "
              f"{f['unnamed_400']}, bad shape {f['bad_shape']}, good follow-up failed {f['follow_up_failed']}",
              flush=True)
        for kind, ex in f["examples"].items():
            for e in ex:
                print(f"  {kind}: {e}")
        b = asyncio.run(big_request(pport, token, a.sessions, 5.0, a.big_n, int(a.big_mb * 1e6), a.timeout))
        print(f"big: {a.sessions} sessions of small calls: p99 {b['p99_base_ms']} ms alone, {b['p99_big_ms']} ms "
              f"while {a.big_n} x {a.big_mb} MB requests ran (ratio {b['p99_ratio']}, max {b['max_big_ms']} ms); "
              f"big answers: {[(x['status'], x['s']) for x in b['big_requests']]}", flush=True)
        big_ok = all(x["status"] in (400, 413) for x in b["big_requests"])
        problems_total = sum(f[k] for k in ("5xx", "hangs", "resets", "error_in_200", "unnamed_400", "bad_shape",
                                            "follow_up_failed"))
        target = (f["requests"] >= 5000 and problems_total == 0 and big_ok and not b["small_errors"]
                  and b["p99_ratio"] is not None and b["p99_ratio"] <= 2.0)
        out = {"bench": "fuzz_proxy", "requests": f["requests"], "by_status": f["by_status"],
               **{k: f[k] for k in ("5xx", "hangs", "resets", "error_in_200", "unnamed_400", "bad_shape",
                                    "follow_up_failed")},
               "fuzz_wall_s": f["wall_s"], "p50_base_ms": b["p50_base_ms"], "p50_big_ms": b["p50_big_ms"],
               "p99_base_ms": b["p99_base_ms"], "p99_big_ms": b["p99_big_ms"],
               "p99_ratio": b["p99_ratio"], "max_big_ms": b["max_big_ms"],
               "big_status": [x["status"] for x in b["big_requests"]], "big_s": [x["s"] for x in b["big_requests"]],
               "small_errors": b["small_errors"], "seed": a.seed, "target_met": bool(target)}
        print(json.dumps(out))
        return 0
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    raise SystemExit(main())
