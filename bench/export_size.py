"""How a session's exported trajectory grows with its length: prompts as deltas vs the
full prompt per call that records used to carry, side by side in one run.

    .venv/bin/python bench/export_size.py [--turns 10 40 160]

Each session is played through a real proxy (in-process, real HTTP, SQLite file store)
against the stand-in engine: every turn appends a ~40-token observation and gets a ~15-token
reply. Printed per length: segment tokens, token ids the export serializes (segments + call
deltas) and what full per-call prompts would add, the JSON size and the time to build and
encode it. Ends with one JSON line; `linear` is true when the serialized ids stay exactly
2x the segment tokens at every length.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--turns", type=int, nargs="+", default=[10, 40, 160])
    a = ap.parse_args()
    from proxy_helpers import ServedApp, standin

    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy import ProxyConfig, ProxyServer

    tok = load_tokenizer("tiny-llama")
    eng, script = standin(tok)
    eng.log_calls = False
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ServedApp(eng.app()) as e, \
            ProxyServer(ProxyConfig(engine_url=e.url, db_path=f"{tmp}/calls.db"), tokenizer=tok) as p:
        admin = {"Authorization": f"Bearer {p.admin_token}"}
        for turns in a.turns:
            sid, key = p.open_session({"task_id": f"t{turns}"})
            msgs = [{"role": "user", "content": "start"}]
            with httpx.Client(timeout=60) as http:
                for i in range(turns):
                    script.say(f"step {i}: I ran the command and read what it printed")
                    r = http.post(p.openai_base_url(sid) + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                  json={"model": "policy", "messages": msgs})
                    msgs += [r.json()["choices"][0]["message"],
                             {"role": "user", "content": f"observation {i}: " + "output line " * 12}]
                t0 = time.perf_counter()
                raw = http.get(f"{p.url}/admin/sessions/{sid}/trajectory", headers=admin).content
                export_s = time.perf_counter() - t0
            d = json.loads(raw)
            seg = sum(len(s["token_ids"]) for s in d["segments"])
            ids = seg + sum(len(c["new_prompt_ids"]) + len(c["completion_ids"]) for c in d["calls"])
            t = p.trajectory(sid)
            full = seg + sum(len(t.call_prompt(c)) + len(c.completion_ids) for c in t.calls)
            rows.append({"turns": turns, "segment_tokens": seg, "ids_serialized": ids, "ids_with_full_prompts": full,
                         "ratio_full_over_delta": round(full / ids, 2), "json_bytes": len(raw),
                         "bytes_per_segment_token": round(len(raw) / seg, 1), "export_ms": round(1e3 * export_s, 1)})
            print("turns {turns:4d}  segment tokens {segment_tokens:7d}  ids serialized {ids_serialized:7d}  "
                  "with full prompts {ids_with_full_prompts:8d} ({ratio_full_over_delta}x)  JSON {json_bytes:8d} B "
                  "({bytes_per_segment_token} B/token)  export {export_ms} ms".format(**rows[-1]))
    linear = all(r["ids_serialized"] == 2 * r["segment_tokens"] for r in rows)
    # Target: the export is linear in the session, exactly 2 ids per segment token at every length.
    print(json.dumps({"bench": "export_size", "rows": rows, "linear": linear, "target_met": linear}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
