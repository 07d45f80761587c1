#!/usr/bin/env bash
# SkyRL's open-source Tinker server for the Tinker bridge's end-to-end test (run by setup.sh).
#
# The server harnessrl tests against is SkyRL 0.4.0 (`skyrl.tinker.api`, JAX backend on CPU);
# see trainers/bridges/tinker_server.py for why that version and its client pin. It cannot be
# pip-installed into .venv: its wheel declares Python >= 3.12 (this is 3.11) and it pins
# tinker < 0.26, while the `bridges` extra holds skyrl 0.3.0 and tinker 0.38.0 (hosted Tinker).
# So this script
#   1. installs the server's JAX-side packages into .venv, pinned, on one line with the
#      torch==2.13.0 and transformers==5.8.0 pins (as setup.sh does), so nothing moves them;
#   2. downloads the skyrl 0.4.0 and tinker 0.25.0 wheels (--no-deps) and unpacks them into
#        .venv/share/harnessrl/skyrl-tinker-0.4.0/    (the server's PYTHONPATH)
#        .venv/share/harnessrl/tinker-client-0.25.0/  (the client the server's test talks with)
#      never onto .venv's own sys.path; a rebuilt .venv redoes it;
#   3. patches one import of skyrl/tinker/types.py (typing.TypedDict -> typing_extensions,
#      which pydantic needs before 3.12) with scripts/patch_skyrl.py, which fails loudly when
#      the line is not there.
# Idempotent (a stamp: the hash of this script and the patch). HARNESSRL_SKIP_TINKER_SERVER=1
# skips it; HARNESSRL_VENV names another venv (default: .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HARNESSRL_VENV:-$ROOT/.venv}"
log() { printf '[setup] tinker server: %s\n' "$*" >&2; }
if [ "${HARNESSRL_SKIP_TINKER_SERVER:-0}" = "1" ]; then
  log "skipped (HARNESSRL_SKIP_TINKER_SERVER=1); the Tinker end-to-end test will skip"
  exit 0
fi
[ -x "$VENV/bin/python" ] || { log "no $VENV/bin/python; run scripts/setup.sh"; exit 1; }

SKYRL_VERSION=0.4.0
CLIENT_VERSION=0.25.0
SHARE="$VENV/share/harnessrl"
SKYRL_DIR="$SHARE/skyrl-tinker-$SKYRL_VERSION"
CLIENT_DIR="$SHARE/tinker-client-$CLIENT_VERSION"
stamp="$SHARE/.tinker-server-stamp"
want="$(cat "$ROOT/scripts/setup_tinker_server.sh" "$ROOT/scripts/patch_skyrl.py" | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -d "$SKYRL_DIR/skyrl" ] && [ -d "$CLIENT_DIR/tinker" ]; then
  exit 0
fi

# pip, quiet, its exit status kept; the find-links notices of this machine's pip config dropped.
pipq() {
  local out
  if ! out="$("$VENV/bin/python" -m pip "$@" -q 2>&1)"; then
    printf '%s\n' "$out" | grep -v '^WARNING: Location' >&2; return 1
  fi
}
pinned() { "$VENV/bin/python" -c "import importlib.metadata as m
print(*(m.version(p) for p in ('torch', 'transformers', 'tinker', 'numpy')))"; }
before="$(pinned)"
t0=$SECONDS
log "installing jax 0.10.2, flax 0.12.8, optax 0.2.8, sqlmodel, aiosqlite, sqlalchemy[asyncio] into $VENV"
pipq install jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 sqlmodel==0.0.50 aiosqlite==0.22.1 \
  "sqlalchemy[asyncio]==2.1.9" torch==2.13.0 transformers==5.8.0
t1=$SECONDS

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log "downloading skyrl==$SKYRL_VERSION (a Python 3.12 wheel) and tinker==$CLIENT_VERSION, --no-deps"
pipq download --no-deps --only-binary=:all: --python-version 3.12 -d "$tmp" "skyrl==$SKYRL_VERSION"
pipq download --no-deps --only-binary=:all: -d "$tmp" "tinker==$CLIENT_VERSION"
t2=$SECONDS

# Unpack next to the target, then swap it in: a half-done folder is never left in place.
unpack() {  # WHEEL DIR
  rm -rf "$2.new"
  "$VENV/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2.new"
  rm -rf "$2"; mv "$2.new" "$2"
}
mkdir -p "$SHARE"
unpack "$tmp/skyrl-$SKYRL_VERSION-py3-none-any.whl" "$SKYRL_DIR"
unpack "$tmp/tinker-$CLIENT_VERSION-py3-none-any.whl" "$CLIENT_DIR"
"$VENV/bin/python" "$ROOT/scripts/patch_skyrl.py" "$SKYRL_DIR/skyrl/tinker/types.py" \
  || { log "patching $SKYRL_DIR/skyrl/tinker/types.py failed"; exit 1; }

# The server's side imports with the overlay; .venv's own pins are unchanged without it.
PYTHONPATH="$SKYRL_DIR:$CLIENT_DIR" JAX_PLATFORMS=cpu "$VENV/bin/python" -c "
import tinker, skyrl.tinker.api, skyrl.tinker.proto_serialization, skyrl.backends.jax
assert tinker.__version__ == '$CLIENT_VERSION', tinker.__version__" \
  || { log "SkyRL $SKYRL_VERSION's server does not import with its overlay"; exit 1; }
[ "$(pinned)" = "$before" ] \
  || { log "the install moved torch/transformers/tinker/numpy of .venv: $before -> $(pinned)"; exit 1; }
sizes="$(du -sh "$SKYRL_DIR" "$CLIENT_DIR" | awk '{printf "%s %s; ", $1, $2}')"
log "ready in $((SECONDS - t0)) s (pip install $((t1 - t0)) s, downloads $((t2 - t1)) s); $sizes"
echo "$want" > "$stamp"
