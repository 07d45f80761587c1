#!/usr/bin/env bash
# Build the offline base sandbox image once: debootstrap bookworm (minbase) with python3, git
# and python3-pytest, a non-root user `agent` (uid 1000) owning /workspace, then `docker import`.
# Tagged harnessrl/base:<sha256 of the recipe section below>, so editing the recipe rebuilds it
# and an existing tag makes this a no-op (< 1 s). Never pulls from a registry. Prints the tag.
# harnessrl.sandboxes.docker.base_image_tag() computes the same tag from this file.
set -euo pipefail
SELF="$(readlink -f "${BASH_SOURCE[0]}")"
recipe_hash() { sed -n '/^# >>> recipe$/,/^# <<< recipe$/p' "$SELF" | sha256sum | cut -c1-12; }
TAG="harnessrl/base:$(recipe_hash)"
if [[ "${1:-}" == "--print-tag" ]]; then echo "$TAG"; exit 0; fi
if docker image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG"; exit 0; fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
[[ $EUID -eq 0 ]] || { echo "building the base image needs root (debootstrap/chroot): run with sudo" >&2; exit 1; }
MIRROR="${HARNESSRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$(mktemp -d /var/tmp/harnessrl-base.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
echo "building $TAG in $ROOT (debootstrap from $MIRROR, ~1-2 min)" >&2
# >>> recipe
SUITE=bookworm
PACKAGES=python3,git,python3-pytest,ca-certificates
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >&2
chroot "$ROOT" /usr/sbin/useradd --uid 1000 --user-group --create-home --shell /bin/bash agent
mkdir -p "$ROOT/workspace" && chown 1000:1000 "$ROOT/workspace"
# Git refuses repositories owned by another uid; the image is single-tenant, trust them all.
chroot "$ROOT" git config --system safe.directory '*'
chroot "$ROOT" git config --system user.name agent
chroot "$ROOT" git config --system user.email agent@harnessrl.invalid
chroot "$ROOT" git config --system init.defaultBranch main
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/*
IMPORT_CHANGES=(--change 'ENV LANG=C.UTF-8' --change 'ENV PYTHONDONTWRITEBYTECODE=1'
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  --change 'WORKDIR /workspace' --change 'CMD ["/bin/bash"]')
# <<< recipe
tar --numeric-owner -C "$ROOT" -c . | docker import "${IMPORT_CHANGES[@]}" \
  --change "LABEL harnessrl.recipe=$(recipe_hash)" - "$TAG" >&2
echo "$TAG"
