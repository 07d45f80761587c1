"""What the host does to a local sandbox's files, never following a symlink the agent planted.

`own` gives fresh box dirs to the sandbox uid (root only); `unlock` takes back what an agent
locked with chmod (u+rwx on dirs, u+rw on files, nothing else changed, so git sees no mode
change); `remove` deletes a tree whatever modes it was left with. Only run while no sandbox
process is alive (between commands every process of a local sandbox is dead).
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from harnessrl.sandboxes.bwrap import Identity


def own(identity: Identity, *paths: Path, tree: bool = False) -> None:
    """Give `paths` (each whole tree with `tree`) to the sandbox uid when launches drop root."""
    if not identity.drops:
        return
    for p in paths:
        os.lchown(p, identity.uid, identity.gid)
        if tree:
            for top, dirs, files in os.walk(p):
                for name in dirs + files:
                    os.lchown(os.path.join(top, name), identity.uid, identity.gid)


def unlock(root: Path) -> None:
    """Owner read/write (and search, on dirs) back on every dir and file under `root`."""
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode):
                continue
            if st.st_mode & 0o700 != 0o700:
                os.chmod(d, stat.S_IMODE(st.st_mode) | 0o700)  # a real dir (lstat), not a link
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    mode = e.stat(follow_symlinks=False).st_mode
                    if mode & 0o600 != 0o600:
                        os.chmod(e.path, stat.S_IMODE(mode) | 0o600)
            except OSError:
                pass


def remove(path: Path) -> None:
    """Delete `path` and everything under it, even dirs an agent made unreadable."""
    shutil.rmtree(path, ignore_errors=True)  # rmtree never follows symlinks
    if os.path.lexists(path):
        unlock(path)
        shutil.rmtree(path, ignore_errors=True)
