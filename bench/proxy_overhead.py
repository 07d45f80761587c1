"""What the proxy costs per call, side by side with going straight to the engine and with
LiteLLM's proxy, all in one run against an instant-response stand-in engine.

    .venv/bin/python bench/proxy_overhead.py [--litellm /path/to/litellm] [--quick]

Paths, each driven by the same minimal keep-alive HTTP/1.1 load generator:
  (a) harnessrl's proxy (own process, durable SQLite store) -> stand-in `/generate`
  (b) straight to the stand-in's OpenAI-style `/v1/chat/completions`
  (c) LiteLLM's proxy server (own process) -> the same OpenAI-style stand-in
Reported: latency p50/p99 and calls/s at 1, 64 and 1,000 concurrent sessions (one
connection each); added p50 = (a) - (b); the CPU time per call of the proxy *process* (from
/proc schedstat, every thread, so the load generator's share of the cores does not count),
non-streamed and streamed, and from it calls/s per core (1000 / CPU ms per call); the
proxy's CPU per call at turn 1 vs turn 40 of sessions that grow to ~16k tokens (only the
new suffix is templated and tokenized). One session is measured `--rounds` times (median);
with `--baseline DIR` another harnessrl's proxy is measured alongside, round by round, on
the same engine (old vs new in one run). Ends with one JSON line; `target_met` is computed
from: p50 added <= 2 ms at one session, proxy CPU <= 1 ms/call at one session (plain and
streamed), turn 40 <= 1.5x turn 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds of a process tree, every thread, from schedstat (ns resolution; /proc's
    utime/stime tick at 10 ms, too coarse for a handful of calls)."""
    total = 0
    for p in _tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except OSError:
                pass  # a thread that just ended
    return total / 1e9


def wait_http(port: int, path: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before answering")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing answered on port {port}{path} within {timeout} s")


async def read_response(r: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 response from `r`: (status, body, whether the server closes the connection).
    Content-Length and chunked bodies. Minimal on purpose: a full client's CPU would crowd the
    servers on a 2-core machine. An empty read raises ConnectionError."""
    head = await r.readline()
    if not head:
        raise ConnectionError("connection closed before a status line")
    status = int(head.split()[1])
    length, chunked, close = None, False, False
    while True:
        line = await r.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        k = k.strip().lower()
        if k == "content-length":
            length = int(v)
        elif k == "transfer-encoding" and "chunked" in v:
            chunked = True
        elif k == "connection" and "close" in v.lower():
            close = True
    if not chunked:
        return status, await r.readexactly(length or 0), close
    parts = []
    while True:
        size = int((await r.readline()).split(b";")[0], 16)
        if size == 0:
            await r.readline()
            return status, b"".join(parts), close
        parts.append(await r.readexactly(size))
        await r.readexactly(2)


class Conn:
    """One keep-alive HTTP/1.1 connection (see read_response)."""

    def __init__(self, port: int):
        self.port = port
        self.r = self.w = None

    async def request(self, path: str, body: bytes, headers: str = "") -> tuple[int, bytes]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        self.w.write((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n{headers}\r\n").encode() + body)
        status, data, _ = await read_response(self.r)
        return status, data

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def admin(port: int, token: str, path: str, body: dict | None = None) -> dict:
    import httpx

    return httpx.post(f"http://127.0.0.1:{port}{path}", json=body or {},
                      headers={"Authorization": f"Bearer {token}"}, timeout=30).json()


#: A first request shaped like a real harness's: a ~6 kB system prompt (Claude Code's and
#: Codex's are 6-17 kB), then the task.
SYSTEM = ("You are a coding agent working in a git repository. Inspect files with the bash tool, make the "
          "smallest change that fixes the failing tests, run them, and submit when they pass. ") * 30
MSGS = [{"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The test suite fails on test_parse; find the bug and fix it."}]


async def run_load(port: int, targets: list[tuple[str, str]], n: int, conc: int, body: bytes) -> dict:
    """n requests over `conc` connections, connection i to targets[i % len] (path, header
    lines); per-request latency in ms."""
    return await run_load_on([(port, path, header) for path, header in targets], n, conc, body)


async def run_load_on(targets: list[tuple[int, str, str]], n: int, conc: int, body: bytes) -> dict:
    """`run_load` over targets of their own ports (port, path, header lines): several proxies."""
    lat: list[float] = []
    left = [n]

    async def worker(i: int) -> None:
        port, path, header = targets[i % len(targets)]
        c = Conn(port)
        try:
            while left[0] > 0:
                left[0] -= 1
                t0 = time.perf_counter()
                status, data = await c.request(path, body, header)
                lat.append((time.perf_counter() - t0) * 1e3)
                if status != 200:
                    raise RuntimeError(f"{path}: HTTP {status}: {data[:300]!r}")
        finally:
            c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    wall = time.perf_counter() - t0
    lat.sort()
    return {"p50_ms": round(statistics.median(lat), 3), "p99_ms": round(lat[int(0.99 * (len(lat) - 1))], 3),
            "calls_per_s": round(n / wall, 1), "n": n}


def measure(port: int, targets: list[tuple[str, str]], n: int, conc: int, body: dict, pid: int | None,
            warmup_conc: int = 8) -> dict:
    raw = json.dumps(body).encode()
    asyncio.run(run_load(port, targets, min(n, 50), min(conc, warmup_conc), raw))  # warm-up
    c0 = cpu_s(pid) if pid else 0.0
    res = asyncio.run(run_load(port, targets, n, conc, raw))
    if pid:
        res["server_cpu_ms_per_call"] = round((cpu_s(pid) - c0) * 1e3 / n, 3)
    return res


def sessions(port: int, token: str, k: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(k):
        s = admin(port, token, "/admin/sessions", {"meta": {"harness": "bench"}})
        out.append((s["session_id"], f"Authorization: Bearer {s['key']}\r\n"))
    return out


def long_session_overhead(port: int, token: str, pid: int, n_sessions: int, turns: int) -> dict:
    """Proxy CPU per call at turn 1 and at turn `turns`, over `n_sessions` sessions growing
    by ~400 tokens of tool output per turn (~16k tokens at turn 40)."""
    words = "def parse(line): return line.split(',') # fixme index error in column handling\n"
    obs = (words * 24)[:1600]
    ss = sessions(port, token, n_sessions)
    hist = {sid: [dict(m) for m in MSGS] for sid, _ in ss}
    cpu_at: dict[int, float] = {}
    lat_at: dict[int, list[float]] = {}
    prompt_tokens: dict[int, int] = {}

    async def turn(t: int) -> None:
        lat = []
        for sid, hdr in ss:
            c = Conn(port)
            body = json.dumps({"model": "policy", "messages": hist[sid]}).encode()
            t0 = time.perf_counter()
            status, data = await c.request(f"/s/{sid}/v1/chat/completions", body, hdr)
            lat.append((time.perf_counter() - t0) * 1e3)
            c.close()
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
            d = json.loads(data)
            prompt_tokens[t] = d["usage"]["prompt_tokens"]
            hist[sid] += [d["choices"][0]["message"], {"role": "user", "content": f"[turn {t}]\n{obs}"}]
        lat_at[t] = lat

    for t in range(1, turns + 1):
        c0 = cpu_s(pid)
        asyncio.run(turn(t))
        cpu_at[t] = (cpu_s(pid) - c0) * 1e3 / n_sessions
    # one segment per session: every turn extended the previous one token-exactly
    traj = admin_get(port, token, f"/admin/sessions/{ss[0][0]}/trajectory")
    return {"turn1_cpu_ms": round(cpu_at[1], 3), f"turn{turns}_cpu_ms": round(cpu_at[turns], 3),
            "cpu_ratio": round(cpu_at[turns] / cpu_at[1], 3),
            "turn1_p50_ms": round(statistics.median(lat_at[1]), 3),
            f"turn{turns}_p50_ms": round(statistics.median(lat_at[turns]), 3),
            "latency_ratio": round(statistics.median(lat_at[turns]) / statistics.median(lat_at[1]), 3),
            f"turn{turns}_prompt_tokens": prompt_tokens[turns], "segments": len(traj["segments"])}


def admin_get(port: int, token: str, path: str) -> dict:
    import httpx

    return httpx.get(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60).json()


LITELLM_KEY = "sk-bench-" + os.urandom(8).hex()


def start_litellm(binary: str, upstream: int, workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cfg = workdir / "litellm.yaml"
    cfg.write_text(f"""model_list:
  - model_name: policy
    litellm_params:
      model: openai/policy
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: sk-standin
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: {LITELLM_KEY}
""")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False",
               LITELLM_LOG="ERROR", NO_DOCS="True")
    proc = subprocess.Popen([binary, "--config", str(cfg), "--port", str(port), "--num_workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "litellm.log", "w"), env=env,
                            cwd=workdir)
    wait_http(port, "/health/liveliness", 240, proc)
    return proc, port


def start_proxy(eport: int, tmp: Path, token: str, tree: str | None = None) -> tuple[subprocess.Popen, int]:
    """A proxy process on a free port with its own store; `tree`: a folder holding the
    `harnessrl` package to run instead of this checkout's (the side-by-side baseline)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    p = subprocess.Popen([PY, "-m", "harnessrl.gym.proxy", "--engine-url", f"http://127.0.0.1:{eport}",
                          "--port", str(port), "--db", str(tmp / f"bench-{port}.db"), "--admin-token", token],
                         cwd=ROOT, stdout=subprocess.PIPE, env=env)
    json.loads(p.stdout.readline())
    return p, port


def one_session_rounds(proxies: dict[str, tuple[subprocess.Popen, int]], token: str, n: int, rounds: int,
                       body: dict) -> dict[str, dict[str, dict]]:
    """CPU per call at one session, plain and streamed, each proxy in turn, `rounds` times
    (so a load that comes and goes on a shared machine falls on all of them alike); per
    proxy and mode: the median round's figures and every round's CPU per call."""
    got: dict[str, dict[str, list[dict]]] = {k: {"plain": [], "streamed": []} for k in proxies}
    for _ in range(rounds):
        for name, (proc, port) in proxies.items():
            for mode, b in (("plain", body), ("streamed", dict(body, stream=True))):
                got[name][mode].append(measure_sessions(port, sessions(port, token, 1), n, 1, b, proc.pid))
    out: dict[str, dict[str, dict]] = {}
    for name, modes in got.items():
        out[name] = {}
        for mode, runs in modes.items():
            runs.sort(key=lambda r: r["server_cpu_ms_per_call"])
            out[name][mode] = dict(runs[len(runs) // 2], rounds_cpu_ms=[r["server_cpu_ms_per_call"] for r in runs])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--litellm", default=shutil.which("litellm") or "/work/.venv-litellm/bin/litellm",
                    help="litellm binary (pip install 'litellm[proxy]' into its own venv); skipped if missing")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the one-session measurement (median taken)")
    ap.add_argument("--baseline", default=None,
                    help="a folder holding another harnessrl package (e.g. `git archive main | tar -x -C DIR/harnessrl`): "
                         "its proxy is measured at one session side by side with this one, round by round")
    a = ap.parse_args()
    scale = 0.25 if a.quick else 1.0
    n_at = {1: int(400 * scale), 64: int(2000 * scale), 1000: int(4000 * scale)}
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    try:
        eport = free_port()
        procs.append(subprocess.Popen([PY, "-m", "harnessrl.gym.doubles.standin", "--port", str(eport)], cwd=ROOT))
        wait_http(eport, "/health", 60)
        token = "bench-admin"
        pp, pport = start_proxy(eport, tmp, token)
        procs.append(pp)
        proxies = {"this": (pp, pport)}
        if a.baseline:
            proxies["baseline"] = start_proxy(eport, tmp, token, str(Path(a.baseline).resolve()))
            procs.append(proxies["baseline"][0])
        body = {"model": "policy", "messages": MSGS}
        lproc, lport, litellm_skip = None, None, None
        if Path(a.litellm).exists():
            try:
                lproc, lport = start_litellm(a.litellm, eport, tmp)
                procs.append(lproc)
            except Exception as e:  # reported, not fatal: the other paths still measure
                litellm_skip = f"litellm did not start: {e}"
        else:
            litellm_skip = f"no litellm binary at {a.litellm}"

        one = one_session_rounds(proxies, token, n_at[1], a.rounds, body)
        print(f"one session, median of {a.rounds} rounds: {one}", file=sys.stderr)
        results: dict = {"proxy": {1: one["this"]["plain"]}, "direct": {}, "litellm": {}}
        for conc, n in n_at.items():
            if conc != 1:
                # every worker in its own session: route by worker (one path per connection)
                results["proxy"][conc] = measure_sessions(pport, sessions(pport, token, conc), n, conc, body, pp.pid)
            results["direct"][conc] = measure(eport, [("/v1/chat/completions", "")], n, conc, body, None)
            if lport:
                ln = max(50, n // 5)
                results["litellm"][conc] = measure(
                    lport, [("/v1/chat/completions", f"Authorization: Bearer {LITELLM_KEY}\r\n")], ln, conc, body,
                    lproc.pid)
            print(f"concurrency {conc}: proxy {results['proxy'][conc]} | direct {results['direct'][conc]}"
                  + (f" | litellm {results['litellm'][conc]}" if lport else ""), file=sys.stderr)
        streamed = one["this"]["streamed"]
        streamed64 = measure_sessions(pport, sessions(pport, token, 64), n_at[64], 64, dict(body, stream=True), pp.pid)
        longs = long_session_overhead(pport, token, pp.pid, max(8, int(24 * scale)), a.turns)
        print(f"streamed c1 {streamed} | c64 {streamed64}\nlong session {longs}", file=sys.stderr)
        print(json.dumps(summarize(results, n_at, one, streamed64, longs, a.turns, lport, litellm_skip)))
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(results: dict, n_at: dict, one: dict, streamed64: dict, longs: dict, turns: int, lport, litellm_skip) -> dict:
    """The JSON line: latencies, CPU per call, calls per second per core (1 / CPU per call:
    what one core of proxy could serve), the side-by-side baseline if any, and the targets."""
    added_p50 = results["proxy"][1]["p50_ms"] - results["direct"][1]["p50_ms"]
    cpu_ns, cpu_s_ = results["proxy"][1]["server_cpu_ms_per_call"], one["this"]["streamed"]["server_cpu_ms_per_call"]
    ratio = longs["cpu_ratio"]
    target = {"p50_added_ms_c1<=2": added_p50 <= 2.0, "proxy_cpu_ms_per_call_c1<=1": cpu_ns <= 1.0,
              "proxy_cpu_ms_per_call_streamed_c1<=1": cpu_s_ <= 1.0, f"turn{turns}/turn1<=1.5": ratio <= 1.5}
    per_core = {str(c): round(1000.0 / results["proxy"][c]["server_cpu_ms_per_call"], 1) for c in n_at}
    out = {
        "bench": "proxy_overhead",
        "added_p50_ms": {str(c): round(results["proxy"][c]["p50_ms"] - results["direct"][c]["p50_ms"], 3) for c in n_at},
        "added_p99_ms": {str(c): round(results["proxy"][c]["p99_ms"] - results["direct"][c]["p99_ms"], 3) for c in n_at},
        "proxy": {str(k): v for k, v in results["proxy"].items()},
        "direct": {str(k): v for k, v in results["direct"].items()},
        "litellm": {str(k): v for k, v in results["litellm"].items()} if lport else {"skipped": litellm_skip},
        "litellm_added_p50_ms": ({str(c): round(results["litellm"][c]["p50_ms"] - results["direct"][c]["p50_ms"], 3)
                                  for c in n_at} if lport else None),
        "proxy_cpu_ms_per_call": {"non_streamed": cpu_ns, "streamed": cpu_s_,
                                  "non_streamed_c64": results["proxy"][64]["server_cpu_ms_per_call"],
                                  "non_streamed_c1000": results["proxy"][1000]["server_cpu_ms_per_call"],
                                  "streamed_c64": streamed64["server_cpu_ms_per_call"]},
        "calls_per_s_per_core": per_core,
        "calls_per_s_per_core_streamed": {"1": round(1000.0 / cpu_s_, 1),
                                          "64": round(1000.0 / streamed64["server_cpu_ms_per_call"], 1)},
        "litellm_cpu_ms_per_call": results["litellm"][1]["server_cpu_ms_per_call"] if lport else None,
        "long_session": longs,
        "targets": target,
        "target_met": all(target.values()),
    }
    if "baseline" in one:
        b, t = one["baseline"], one["this"]
        out["side_by_side_c1"] = {
            "baseline_cpu_ms_per_call": {m: b[m]["server_cpu_ms_per_call"] for m in b},
            "this_cpu_ms_per_call": {m: t[m]["server_cpu_ms_per_call"] for m in t},
            "ratio": {m: round(t[m]["server_cpu_ms_per_call"] / b[m]["server_cpu_ms_per_call"], 3) for m in t},
            "rounds_cpu_ms": {"baseline": {m: b[m]["rounds_cpu_ms"] for m in b},
                              "this": {m: t[m]["rounds_cpu_ms"] for m in t}}}
    return out


def measure_sessions(port: int, ss: list[tuple[str, str]], n: int, conc: int, body: dict, pid: int) -> dict:
    """`measure` with worker i in its own session (path and key); the warm-up uses every worker."""
    return measure(port, [(f"/s/{sid}/v1/chat/completions", hdr) for sid, hdr in ss], n, conc, body, pid,
                   warmup_conc=conc)


if __name__ == "__main__":
    sys.exit(main())
