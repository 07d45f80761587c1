#!/usr/bin/env bash
# bench/gpu_check.sh: issue 12's GPU check as one prepared command (the work: bench/gpu_check.py).
#
# On a GPU box (one GPU, its own torch >= 2.11 with CUDA and transformers 5, no network):
# carry bench/wheels with the working tree (the device run's carry: ["bench/wheels"]), then
#     bash bench/gpu_check.sh             # random-init ~0.5B Qwen2 shape, CUDA, bf16; < 10 min
# On any CPU, the same code path with a tiny model in float32 (about 30 s):
#     bash bench/gpu_check.sh --dry-run
# Once, where PyPI is reachable, fetch the wheels the check may need there:
#     bash bench/gpu_check.sh --prepare-wheels
#
# It prints one JSON line on stdout (progress goes to stderr): device, dtype, params,
# train_tokens_per_s, mfu, weight_sync_s, decode_tokens_per_s {"1","16","64"},
# logprob_mismatch {mean, max}, dry_run, target_met, then details (checks, per-step numbers);
# also when a phase fails or the time limit hits (then with "error" and what was measured).
# Exit status: 0 target met, 1 target not met, 2 set-up failure, 124 past the 540 s limit.
#
# Python: $PYTHON if set, else the first of python3, python that imports torch and transformers.
# If that python lacks a dependency of the modules the check imports (fastapi, uvicorn, httpx,
# pydantic, orjson, psutil, pyyaml, jinja2, safetensors, and theirs), a throw-away venv with
# --system-site-packages is made (the machine's own torch and transformers stay in use) and
# the missing ones are installed into it offline at their pins (bench/wheels/requirements.txt):
# pip install --no-index --find-links bench/wheels, which takes from bench/wheels only the
# dependencies the machine lacks. Without a venv module: pip install --target instead.
# The repository goes on PYTHONPATH as the package `harnessrl` through a symlink; nothing is
# installed into the machine's own python.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
WHEELS="$here/wheels"
# Top-level distributions the check needs beyond torch/transformers (their own deps come
# along); the same list as REQS in bench/gpu_check_wheels.py.
REQS=(fastapi uvicorn httpx pydantic orjson psutil pyyaml jinja2 safetensors)
# The import names of the same, in the same order.
MODULES=(fastapi uvicorn httpx pydantic orjson psutil yaml jinja2 safetensors)

die() { echo "gpu_check.sh: $*" >&2; exit 2; }

prepare_wheels() {  # bench/gpu_check_wheels.py: every python/arch, markers evaluated per target
  "${PYTHON:-python3}" "$here/gpu_check_wheels.py" "$WHEELS" || die "preparing $WHEELS failed"
}

find_python() {
  local c
  for c in ${PYTHON:-} python3 python; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch, transformers" >/dev/null 2>&1; then
      echo "$c"; return 0
    fi
  done
  die "no python with torch and transformers found (set PYTHON=/path/to/python)"
}

missing_modules() {  # the MODULES that $1 cannot import, space separated
  "$1" - "${MODULES[@]}" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}

PY=""         # the python that runs the check (set by with_deps)
EXTRA_PATH="" # a --target folder to put on PYTHONPATH, when no venv could be made

with_deps() {  # sets PY to a python that imports every module, installing from bench/wheels if needed
  local py="$1" missing
  missing="$(missing_modules "$py")"
  if [[ -z "$missing" ]]; then PY="$py"; return 0; fi
  [[ -f "$WHEELS/requirements.txt" ]] || die "$py lacks: $missing; carry bench/wheels (made by: bash bench/gpu_check.sh --prepare-wheels)"
  # only the missing distributions, at their pins; pip resolves their deps against what the
  # machine has, taking from bench/wheels only what it lacks (the least shadowing)
  local want=() i m
  for i in "${!MODULES[@]}"; do
    for m in $missing; do [[ "$m" == "${MODULES[$i]}" ]] && want+=("$(grep -i "^${REQS[$i]}==" "$WHEELS/requirements.txt")"); done
  done
  local venv="${TMPDIR:-/tmp}/harnessrl-gpu-check-venv"
  echo "gpu_check.sh: $py lacks: $missing; installing ${want[*]} from bench/wheels" >&2
  rm -rf "$venv"
  if "$py" -m venv --system-site-packages "$venv" >&2; then
    # --system-site-packages reaches the base interpreter only; when $py is itself a venv,
    # its own site-packages (torch, transformers) come in through a .pth, after the venv's
    "$py" -c "import sys; print('\n'.join(p for p in sys.path if p.endswith('-packages')))" \
      > "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_harnessrl_base.pth"
    "$venv/bin/python" -m pip install -q --no-index --find-links "$WHEELS" "${want[@]}" >&2 \
      || die "offline install from $WHEELS failed (were the wheels made for this python and arch?)"
    PY="$venv/bin/python"
  else  # no venv module: a --target folder (pip then installs the whole closure from bench/wheels)
    echo "gpu_check.sh: no venv with $py; installing into $venv/site instead" >&2
    "$py" -m pip install -q --no-index --find-links "$WHEELS" --target "$venv/site" -c "$WHEELS/constraints.txt" \
      "${want[@]}" >&2 || die "offline install from $WHEELS into $venv/site failed"
    PY="$py" EXTRA_PATH="$venv/site"
  fi
  missing="$(PYTHONPATH="$EXTRA_PATH" missing_modules "$PY")"
  [[ -z "$missing" ]] || die "still missing after the install: $missing"
}

if [[ "${1:-}" == "--prepare-wheels" ]]; then
  prepare_wheels
  exit 0
fi

base="$(find_python)" || exit 2
with_deps "$base"
# the working tree as the package `harnessrl`, whatever its folder is called
pkgroot="$(mktemp -d)"
trap 'rm -rf "$pkgroot"' EXIT
ln -s "$repo" "$pkgroot/harnessrl"
export PYTHONPATH="$pkgroot${EXTRA_PATH:+:$EXTRA_PATH}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import harnessrl.trainers.engine" || die "the repository does not import as harnessrl"
rc=0
# GPU_CHECK_SCRIPT: another script of bench/ in the same environment (bench/gpu_decode_profile.py)
timeout -k 10 540 "$PY" "${GPU_CHECK_SCRIPT:-$here/gpu_check.py}" "$@" || rc=$?
exit $rc
