#!/usr/bin/env bash
# Install the real agent harnesses, pinned, into a cached toolchain (idempotent; < 1 s when done).
#
#   scripts/install_harnesses.sh [--list] [--print-home] [HARNESS ...]     (default: all)
#
# Layout under ${HARNESSRL_TOOLCHAIN:-${HARNESSRL_HOME:-~/.cache/harnessrl}/toolchain}/:
#   node/bin/node            a copy of the host node runtime (runs in the bookworm sandbox image;
#                            it needs only glibc + libstdc++); bind-mounted read-only into sandboxes
#   npm/<harness>/           `npm install -g --prefix` of one npm harness: bin/<cli>, lib/node_modules
#   venvs/<harness>/         a Python venv for a harness that runs BESIDE the sandbox, on the host
#   <kind>/<harness>/.harnessrl-installed   stamp: "<package spec>" written last; a dir without a
#                            matching stamp is half-installed and gets rebuilt from scratch
# harnessrl.adapters.toolchain reads the same layout (keep the two in step).
set -euo pipefail

HOME_DIR="${HARNESSRL_HOME:-$HOME/.cache/harnessrl}"
TC="${HARNESSRL_TOOLCHAIN:-$HOME_DIR/toolchain}"  # models move on their own: HARNESSRL_MODELS
PY="${HARNESSRL_HARNESS_PYTHON:-python3}"

# name -> pinned package spec. Sandboxed (inside) harnesses come from npm, beside ones from PyPI.
declare -A NPM_PKG=(
  [codex]="@openai/codex@0.171.0"
  [claude-code]="@anthropic-ai/claude-code@2.1.332"
  [opencode]="opencode-ai@1.18.33"
  [gemini-cli]="@google/gemini-cli@0.61.0"  # needs node >= 20
)
declare -A PIP_PKG=(
  [mini-swe-agent]="mini-swe-agent==2.4.6"
  [aider]="aider-chat==0.86.2"
)
ALL=(mini-swe-agent codex claude-code opencode aider gemini-cli)

case "${1:-}" in
  --list) for h in "${ALL[@]}"; do echo "$h ${NPM_PKG[$h]:-${PIP_PKG[$h]:-}}"; done; exit 0 ;;
  --print-home) echo "$TC"; exit 0 ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
esac

WANT=("$@")
[[ ${#WANT[@]} -eq 0 ]] && WANT=("${ALL[@]}")
for h in "${WANT[@]}"; do
  if [[ -z "${NPM_PKG[$h]:-}" && -z "${PIP_PKG[$h]:-}" ]]; then
    echo "install_harnesses: unknown harness '$h' (known: ${ALL[*]}; a harness config file with" \
         "install = \"npm:...\" or \"pip:...\" installs with: harnessrl harness install CONFIG)" >&2; exit 2
  fi
done
mkdir -p "$TC"
log() { echo "install_harnesses: $*"; }
stamped() { [[ -f "$1/.harnessrl-installed" && "$(cat "$1/.harnessrl-installed")" == "$2" ]]; }

install_node() {
  local dest="$TC/node" src
  src="$(readlink -f "$(command -v node || true)")"
  [[ -x "$src" ]] || { echo "install_harnesses: node not found on PATH (apt-get install nodejs)" >&2; exit 1; }
  local ver; ver="$("$src" --version)"
  if stamped "$dest" "node $ver"; then log "node $ver: present"; return; fi
  rm -rf "$dest"; mkdir -p "$dest/bin"
  cp "$src" "$dest/bin/node"
  echo "node $ver" > "$dest/.harnessrl-installed"
  log "node $ver: copied from $src"
}

install_npm() {
  local name="$1" spec="${NPM_PKG[$1]}" dest="$TC/npm/$1"
  if stamped "$dest" "$spec"; then log "$name ($spec): present"; return; fi
  command -v npm >/dev/null || { echo "install_harnesses: npm not found (apt-get install npm)" >&2; exit 1; }
  rm -rf "$dest" "$dest.tmp"; mkdir -p "$dest.tmp"
  local t0=$SECONDS
  npm install -g --prefix "$dest.tmp" --no-audit --no-fund --loglevel=error "$spec" >&2
  # Bin links are relative (../lib/node_modules/...), so the prefix can move and be mounted anywhere.
  mv "$dest.tmp" "$dest"
  local pkg="${spec%@*}" got
  got="$(node -p "require('$dest/lib/node_modules/$pkg/package.json').version")"
  [[ "$got" == "${spec##*@}" ]] || { echo "install_harnesses: $name: wanted ${spec##*@}, npm installed $got" >&2; exit 1; }
  echo "$spec" > "$dest/.harnessrl-installed"
  log "$name ($spec): installed in $((SECONDS - t0)) s -> $dest"
}

install_pip() {
  local name="$1" spec="${PIP_PKG[$1]}" dest="$TC/venvs/$1"
  if stamped "$dest" "$spec"; then log "$name ($spec): present"; return; fi
  rm -rf "$dest"  # venvs hard-code their path in scripts: build in place, stamp last
  local t0=$SECONDS
  "$PY" -m venv "$dest"
  # grep drops pip's noise about the local find-links dirs that lack a package
  "$dest/bin/python" -m pip install --quiet --disable-pip-version-check "$spec" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "install_harnesses: pip install $spec failed" >&2; exit 1; }
  echo "$spec" > "$dest/.harnessrl-installed"
  log "$name ($spec): installed in $((SECONDS - t0)) s -> $dest"
}

need_node=0
for h in "${WANT[@]}"; do [[ -n "${NPM_PKG[$h]:-}" ]] && need_node=1; done
[[ $need_node -eq 1 ]] && install_node
for h in "${WANT[@]}"; do
  if [[ -n "${NPM_PKG[$h]:-}" ]]; then install_npm "$h"; else install_pip "$h"; fi
done
log "toolchain: $TC"
