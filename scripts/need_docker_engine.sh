#!/usr/bin/env bash
# Does set-up need to install Debian's docker.io? Exit 0: yes; exit 1: no.
#
# No, when a Docker engine already answers (`docker info`), or when the engine binary
# `dockerd` is present (set-up then starts it). A `docker` CLI alone is not an engine: this
# machine image ships the CLI without `dockerd`, and a check for `docker` skipped the install
# and then could not start the daemon. DOCKERD_SEARCH_PATH (colon-separated) overrides where
# `dockerd` is looked for (default: $PATH plus /usr/sbin, /usr/bin, /usr/local/bin).
set -u
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  exit 1
fi
IFS=':' read -r -a dirs <<< "${DOCKERD_SEARCH_PATH:-$PATH:/usr/sbin:/usr/bin:/usr/local/bin}"
for d in "${dirs[@]}"; do
  if [ -n "$d" ] && [ -f "$d/dockerd" ] && [ -x "$d/dockerd" ]; then
    exit 1
  fi
done
exit 0
