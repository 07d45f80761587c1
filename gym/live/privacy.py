"""The live store's folder is private: 0700, its files 0600 (they hold full prompts: the
user's code, and any secret a harness sends). Made so before the first byte is written."""
from __future__ import annotations

import os
import stat
from pathlib import Path

DB_NAME = "calls.db"
"""The store's SQLite file inside the folder (its `-wal`/`-shm` get the same mode from SQLite)."""
SERVER_FILE = "serve.json"
"""Where a running `harnessrl serve` leaves its URL and admin token for the other commands."""


def private_dir(folder: str | Path) -> Path:
    """`folder` created (parents too) and set to 0700; its database file created 0600 if absent."""
    d = Path(folder).expanduser()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    db = d / DB_NAME
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(db, 0o600)
    return d


def write_private(path: Path, text: str) -> None:
    """Write `text` to a new 0600 file (replaced atomically; never readable by others)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def modes(folder: str | Path) -> dict[str, str]:
    """The permission bits of the folder and every file in it, as octal strings (for checks)."""
    d = Path(folder).expanduser()
    out = {".": oct(stat.S_IMODE(d.stat().st_mode))}
    out |= {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in sorted(d.iterdir()) if p.is_file()}
    return out
