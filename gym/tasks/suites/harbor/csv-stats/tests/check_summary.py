"""Score /app/summary.json field by field; print the metrics as JSON."""
import csv
import json
import os
import sys

with open("/app/sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
want_total = round(sum(float(r["amount"]) for r in rows), 2)
by_region = {}
for r in rows:
    by_region[r["region"]] = by_region.get(r["region"], 0.0) + float(r["amount"])
want = {"rows": len(rows), "total": want_total, "top_region": max(by_region, key=by_region.get)}
try:
    with open(os.environ["SUMMARY_PATH"]) as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    print(f"no readable summary: {e}", file=sys.stderr)
    got = {}
got = got if isinstance(got, dict) else {}
correct = 0
for key, value in want.items():
    have = got.get(key)
    same = abs(float(have) - value) < 1e-6 if key == "total" and isinstance(have, (int, float)) else have == value
    print(f"{key}: want {value!r}, got {have!r}: {'ok' if same else 'WRONG'}", file=sys.stderr)
    correct += bool(same)
print(json.dumps({"reward": 1.0 if correct == len(want) else 0.0, "fields_correct": correct,
                  "fields_total": len(want)}))
