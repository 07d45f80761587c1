"""Materialise a RepoSpec on the host, and the in-sandbox git scripts every backend shares.

Contract: `materialize(spec, dest)` leaves at `dest` a fresh git repository on branch `main`
at the spec's base commit whose object store holds that commit's history only (nothing after
base, no remotes, no tags, no hooks), whatever the source was (a repository, a bundle, or a
.tar/.tar.gz archive of one). Backends bake it into an image or a cached checkout, run the
spec's setup commands in it once, then `FINALIZE_SCRIPT` records what set-up left behind so
that reset keeps it and diff ignores it. `RESET_SCRIPT` and `DIFF_SCRIPT` run *inside* the
sandbox (never on the host, where a planted .git/config could execute code).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from harnessrl.sandboxes.base import RepoSpec, SandboxError

#: Bump when materialize/finalize change what a built checkout contains (rebuilds caches).
LAYOUT_VERSION = "7"
_SHA = re.compile(r"^[0-9a-f]{40}$")


def _git(*args: str, cwd: str | Path | None = None) -> str:
    proc = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def _unpack_archive(archive: Path, into: Path) -> Path:
    """Extract a .tar/.tar.gz of a git repository and return the repository's directory."""
    with tarfile.open(archive) as tf:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(into, **kwargs)
    candidates = [into] + sorted(p for p in into.iterdir() if p.is_dir())
    for c in candidates:
        if (c / ".git").exists() or ((c / "HEAD").is_file() and (c / "objects").is_dir()):
            return c
    raise SandboxError(f"archive {archive} holds no git repository (no .git at its top or in "
                       "its single top-level folder)")


def _source_repo(spec: RepoSpec, scratch: Path) -> str:
    """A path git can clone from: the repository itself, the bundle, or the unpacked archive."""
    src = Path(spec.source).expanduser()
    if not src.exists():
        raise SandboxError(f"repo source {spec.source!r} of {spec.repo_id!r} does not exist")
    if src.is_dir():
        return str(src)
    name = src.name.lower()
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        return str(_unpack_archive(src, scratch / "unpacked"))
    return str(src)  # a git bundle; `git clone` reads it directly


def materialize(spec: RepoSpec, dest: Path) -> str:
    """Create the checkout at `dest` (must not exist); return the resolved base commit sha."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-src-") as scratch_s:
        scratch = Path(scratch_s)
        clone = scratch / "clone"
        _git("clone", "-q", "--no-checkout", _source_repo(spec, scratch), str(clone))
        try:
            sha = _git("rev-parse", "--verify", "--quiet", f"{spec.base_commit}^{{commit}}", cwd=clone)
        except SandboxError:
            raise SandboxError(f"base_commit {spec.base_commit!r} not found in {spec.source!r} "
                               f"(repo {spec.repo_id!r})") from None
        _git("update-ref", "refs/harnessrl/base", sha, cwd=clone)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "-b", "main", str(dest))
        # Fetching one ref copies only base's ancestry: later commits never reach the sandbox.
        _git("fetch", "-q", "--no-tags", "--update-head-ok", str(clone), "refs/harnessrl/base:refs/heads/main", cwd=dest)
        _git("checkout", "-q", "-f", "main", cwd=dest)
    # Agents may commit (diff and reset ignore it); give them an identity on every backend.
    _git("config", "user.name", "agent", cwd=dest)
    _git("config", "user.email", "agent@harnessrl.invalid", cwd=dest)
    shutil.rmtree(dest / ".git" / "hooks", ignore_errors=True)
    (dest / ".git" / "hooks").mkdir()
    shutil.rmtree(dest / ".git" / "logs", ignore_errors=True)
    return sha


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def spec_key(spec: RepoSpec, extra: str = "") -> str:
    """Content key of what a built checkout holds: equal keys mean interchangeable images."""
    commit = spec.base_commit
    if not _SHA.match(commit):  # a ref: pin it to what the source holds right now
        src = Path(spec.source).expanduser()
        if src.is_dir():
            try:
                commit = _git("rev-parse", "--verify", f"{commit}^{{commit}}", cwd=src)
            except SandboxError:
                raise SandboxError(f"base_commit {spec.base_commit!r} not found in {spec.source!r}") from None
        elif src.is_file():
            commit = f"{commit}@{_file_digest(src)}"
        else:
            raise SandboxError(f"repo source {spec.source!r} of {spec.repo_id!r} does not exist")
    blob = json.dumps([LAYOUT_VERSION, spec.repo_id, commit, list(spec.setup_commands),
                       spec.workdir, extra])
    return hashlib.sha256(blob.encode()).hexdigest()


def image_name(spec: RepoSpec) -> str:
    """Docker repository name for a spec (tags allow only [a-z0-9_.-])."""
    return "harnessrl/task-" + (re.sub(r"[^a-z0-9_.-]+", "-", spec.repo_id.lower()).strip("-._") or "repo")


# --- scripts run inside the sandbox: bash -c SCRIPT harnessrl <workdir> <base sha> [pristine] ---

#: After setup commands: everything they left untracked (or ignored) is part of the base state:
#: reset keeps it (`git clean -e`), diff ignores it (info/exclude). Then the pristine dir ($3,
#: read-only to the agent) takes base's objects (the repository borrows them through
#: objects/info/alternates) and a copy of .git's config/info/hooks and refs: reset rebuilds .git
#: from it and diff reads base from it, so nothing the agent does to .git (deleting it, forging
#: its index, replace refs, alternates, commondir) changes what base is.
FINALIZE_SCRIPT = r"""
set -euo pipefail
cd "$1"
git ls-files --others --directory --no-empty-directory | sed 's|^|/|' > .git/info/harnessrl-keep
cat .git/info/harnessrl-keep >> .git/info/exclude
git update-ref refs/heads/main "$2"
git config gc.auto 0
# Everything of the base state in packs, nothing loose.
git repack -a -d -q && git prune --expire=now && rm -rf .git/logs
rm -rf "$3" && mkdir -p "$3"/objects && cp -a .git/config .git/info .git/hooks "$3"/
if [ -s .git/info/harnessrl-keep ]; then  # a copy, so reset can undo the agent's edits in there
  sed 's|^/||; s|/$||' .git/info/harnessrl-keep | tar -cf "$3"/keep.tar -T -
fi
mv .git/objects/pack "$3"/objects/pack && mkdir -p .git/objects/pack .git/objects/info
echo "$3/objects" > .git/objects/info/alternates
mkdir -p "$3"/refs/heads "$3"/refs/tags && echo "$2" > "$3"/refs/heads/main
"""

#: Back to base: make everything the agent owns writable again (a `chmod -R a-w` must not
#: block reset), rebuild .git from the pristine copy (and the index from base's tree, checked
#: against file contents: no forged index entry or skip-worktree bit keeps a change alive),
#: reset the tree, remove untracked files except what set-up left, and restore that from its
#: copy if it changed since $4 (epoch seconds of the last reset; without it, set-up's files are
#: trusted as left).
RESET_SCRIPT = r"""
set -euo pipefail
shopt -s nullglob dotglob
cd "$1"
pristine="${3:-}"
# only what lacks the owner's rights: chmod bumps ctime, which tells reset what the agent touched
find . ! -type l \( ! -perm -u=rw -o \( -type d ! -perm -u=x \) \) -exec chmod u+rwX {} + 2>/dev/null || true
if [ -d "$pristine/objects/pack" ]; then
  rm -rf .git
  mkdir -p .git/objects/info .git/objects/pack
  cp -a "$pristine"/config "$pristine"/info "$pristine"/hooks "$pristine"/refs .git/
  echo "$pristine/objects" > .git/objects/info/alternates
  echo 'ref: refs/heads/main' > .git/HEAD
else  # no pristine copy (a checkout being built): the same with git itself
  rm -rf .git/*.lock .git/logs .git/index
  git symbolic-ref HEAD refs/heads/main
  for ref in $(git for-each-ref --format='%(refname)'); do
    [ "$ref" = refs/heads/main ] || git update-ref -d "$ref"
  done
fi
# A fresh index from base (no skip-worktree or assume-unchanged bits, no forged stat data),
# refreshed by content, so reset rewrites only the files that differ.
git read-tree "$2"
git update-index -q --refresh >/dev/null || true
git reset -q --hard "$2"
keep=()
if [ -f .git/info/harnessrl-keep ]; then
  mapfile -t lines < .git/info/harnessrl-keep
  for p in "${lines[@]}"; do keep+=(-e "$p"); done
fi
git clean -q -ffdx "${keep[@]}"
# What set-up left (kept above): if anything in it changed since the last reset ($4, a time only
# the caller holds: the agent cannot forge a ctime back), put all of it back from the copy.
if [ -n "${4:-}" ] && [ -f "$pristine/keep.tar" ]; then
  mapfile -t kept < <(sed 's|^/||; s|/$||' .git/info/harnessrl-keep)
  changed=""
  for p in "${kept[@]}"; do [ -e "$p" ] || [ -L "$p" ] || changed=1; done
  # find's -newerct drops the fraction of "@secs.frac"; compare ctimes at full precision.
  [ -n "$changed" ] || changed="$( { find "${kept[@]}" -printf '%C@\n' 2>/dev/null || echo 9e99; } \
    | awk -v since="$4" '$1 + 0 > since + 0 { print 1; exit }')"
  if [ -n "$changed" ]; then
    rm -rf "${kept[@]}"
    tar -xf "$pristine/keep.tar"
  fi
fi
"""

#: The agent's changes against base as one binary git patch: every file of the working tree,
#: untracked and ignored ones included, but not what set-up left (the pristine harnessrl-keep
#: list) and not bytecode or tool caches (`*.pyc`, `__pycache__`, `.pytest_cache`,
#: `.mypy_cache`, `.ruff_cache`, `.hypothesis`, `.tox`, `.nox`: never graded, often large).
#: Read through a private git dir whose objects are the pristine base's, with a fresh index
#: and no global config, so neither the agent's .git (gone, forged index, hooks, filters) nor
#: its ~/.gitconfig shapes the result.
#: Files the agent made unreadable are made readable first (it owns every one of them).
DIFF_SCRIPT = r"""
set -euo pipefail
cd "$1"
pristine="${3:-/opt/harnessrl/pristine}"
# only what lacks the owner's rights: chmod bumps ctime, which tells reset what the agent touched
find . ! -type l \( ! -perm -u=rw -o \( -type d ! -perm -u=x \) \) -exec chmod u+rwX {} + 2>/dev/null || true
tmp="$(mktemp -d /tmp/.harnessrl-diff.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
if [ -d "$pristine/objects/pack" ]; then
  mkdir -p "$tmp/git/objects/info" "$tmp/git/refs" "$tmp/git/info"
  echo "$pristine/objects" > "$tmp/git/objects/info/alternates"
  echo "$2" > "$tmp/git/HEAD"
  export GIT_DIR="$tmp/git"
  keep="$pristine/info/harnessrl-keep"
else
  export GIT_DIR="$PWD/.git"
  keep="$PWD/.git/info/harnessrl-keep"
fi
export GIT_WORK_TREE="$PWD" GIT_INDEX_FILE="$tmp/index" GIT_CONFIG_GLOBAL=/dev/null
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.excludesFile=/dev/null \
  -c core.autocrlf=false -c core.safecrlf=false -c core.quotePath=true "$@"; }
caches=()
for d in __pycache__ .pytest_cache .mypy_cache .ruff_cache .hypothesis .tox .nox; do
  caches+=(":(exclude,glob)**/$d/**")
done
g add -A -f -- . "${caches[@]}" ':(exclude,glob)**/*.py[co]' >/dev/null
specs=()
if [ -s "$keep" ]; then
  mapfile -t lines < "$keep"
  for p in "${lines[@]}"; do p="${p#/}"; p="${p%/}"; [ -z "$p" ] || specs+=(":(top,literal)$p"); done
fi
[ ${#specs[@]} -eq 0 ] || g rm -r -q --cached --ignore-unmatch -- "${specs[@]}" >/dev/null
g diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "$2"
"""

__all__ = ["materialize", "spec_key", "image_name", "FINALIZE_SCRIPT", "RESET_SCRIPT",
           "DIFF_SCRIPT", "LAYOUT_VERSION"]
