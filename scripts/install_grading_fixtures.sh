#!/usr/bin/env bash
# What the grader's honesty tests need offline (idempotent; < 1 s when done): three pytest
# versions, each with its own dependencies, and the sdist of a real unittest-style project.
#
#   scripts/install_grading_fixtures.sh [--print-home]
#
# Layout under ${HARNESSRL_HOME:-~/.cache/harnessrl}/grading/:
#   pytest/<major>/          `pip install --target` of pytest <major> (pure-Python wheels for
#                            Python 3.11, the sandboxes' python); mounted read-only into a
#                            sandbox and named in RewardConfig.runner_paths
#   pytest/<major>/.harnessrl-installed   stamp: "<package spec>" written last
#   sdist/<file>.tar.gz      a project's own source release, tests included
# tests/grading_helpers.py reads the same layout (keep the two in step).
set -euo pipefail

HOME_DIR="${HARNESSRL_HOME:-$HOME/.cache/harnessrl}/grading"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${HARNESSRL_GRADING_PIP_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3

# major -> pinned spec: 7.4 and 8.3 are each line's last release, 9 the newest on PyPI.
declare -A PYTEST=([7]="pytest==7.4.4" [8]="pytest==8.3.5" [9]="pytest==9.2.0")
# A pure-Python project whose own suite is unittest.TestCase classes with subTest.
SDIST="more-itertools==10.7.0"
SDIST_FILE="more_itertools-10.7.0.tar.gz"

case "${1:-}" in
  --print-home) echo "$HOME_DIR"; exit 0 ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
esac
log() { echo "install_grading_fixtures: $*"; }
stamped() { [[ -f "$1/.harnessrl-installed" && "$(cat "$1/.harnessrl-installed")" == "$2" ]]; }
# pip, quiet, its exit status kept; the notices about this machine's find-links dirs dropped
pipq() {
  local out
  if ! out="$("$PY" -m pip "$@" --quiet --disable-pip-version-check 2>&1)"; then
    printf '%s\n' "$out" | grep -v "is ignored: it is neither a file nor a directory" >&2; return 1
  fi
}

for major in 7 8 9; do
  spec="${PYTEST[$major]}" dest="$HOME_DIR/pytest/$major"
  if stamped "$dest" "$spec"; then log "$spec: present"; continue; fi
  rm -rf "$dest" "$dest.tmp"; mkdir -p "$dest.tmp"
  # Wheels for the sandboxes' Python 3.11 whatever runs pip: no tomli, no exceptiongroup.
  pipq install --target "$dest.tmp" --python-version 3.11 --only-binary=:all: "$spec" \
    || { echo "install_grading_fixtures: pip install $spec failed" >&2; exit 1; }
  rm -rf "$dest.tmp/bin"  # console scripts name this host's python; the graders run `-m pytest`
  chmod -R a+rX "$dest.tmp"  # read by the sandboxes' unprivileged users
  mv "$dest.tmp" "$dest"
  echo "$spec" > "$dest/.harnessrl-installed"
  log "$spec: installed -> $dest"
done

if [[ -f "$HOME_DIR/sdist/$SDIST_FILE" ]]; then
  log "$SDIST: present"
else
  mkdir -p "$HOME_DIR/sdist"
  pipq download --no-deps --no-binary=:all: -d "$HOME_DIR/sdist.tmp" "$SDIST" \
    || { echo "install_grading_fixtures: pip download $SDIST failed" >&2; exit 1; }
  mv "$HOME_DIR/sdist.tmp/$SDIST_FILE" "$HOME_DIR/sdist/$SDIST_FILE"
  rm -rf "$HOME_DIR/sdist.tmp"
  log "$SDIST: downloaded -> $HOME_DIR/sdist/$SDIST_FILE"
fi
