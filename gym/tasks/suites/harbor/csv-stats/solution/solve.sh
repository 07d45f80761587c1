#!/bin/bash
set -e
python3 - <<'PY'
import csv, json, os
with open("/app/sales.csv", newline="") as f:
    rows = list(csv.DictReader(f))
regions = {}
for r in rows:
    regions[r["region"]] = regions.get(r["region"], 0.0) + float(r["amount"])
summary = {"rows": len(rows), "total": round(sum(float(r["amount"]) for r in rows), 2),
           "top_region": max(regions, key=regions.get)}
with open(os.environ["OUT"], "w") as f:
    json.dump(summary, f)
PY
