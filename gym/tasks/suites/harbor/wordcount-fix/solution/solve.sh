#!/bin/bash
set -e
cd /app
python3 - <<'PY'
import pathlib
p = pathlib.Path("wordcount.py")
p.write_text(p.read_text().replace('len([w for w in text.split(" ") if w != ""])', "len(text.split())"))
PY
