"""Make skyrl 0.3.0's generator interface importable on Python < 3.12 (run by setup.sh).

`import skyrl.train.generators.base` runs `skyrl/backends/__init__.py`, which imports
`skyrl.tinker.types`; that module declares a pydantic model field of a `typing.TypedDict`,
and pydantic refuses those before Python 3.12 ("Please use `typing_extensions.TypedDict`").
This rewrites that one import line of the installed file to take `TypedDict` from
typing_extensions (the drop-in pydantic asks for); nothing else changes. Idempotent; a
no-op on Python >= 3.12, and an error when the installed file is not the one it knows.

    python scripts/patch_skyrl.py [FILE]   # default: the installed skyrl/tinker/types.py
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

OLD = "from typing import Annotated, Any, Literal, TypedDict\n"
NEW = ("from typing import Annotated, Any, Literal\n\n"
       "from typing_extensions import TypedDict  # patched by harnessrl: pydantic needs it on Python < 3.12\n")


def patch_text(text: str) -> str:
    """The file's text with the one import line replaced; unchanged when already patched."""
    if NEW in text:
        return text
    if text.count(OLD) != 1:
        raise ValueError("skyrl/tinker/types.py does not hold the import line this patch expects "
                         f"({OLD.strip()!r}); is skyrl 0.3.0 installed?")
    return text.replace(OLD, NEW)


def installed_file() -> Path:
    """skyrl/tinker/types.py of the installed skyrl, found without importing skyrl.tinker."""
    spec = importlib.util.find_spec("skyrl")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("skyrl is not installed (pip install -e '.[bridges]')")
    return Path(list(spec.submodule_search_locations)[0]) / "tinker" / "types.py"


def main(argv: list[str]) -> int:
    if sys.version_info >= (3, 12) and not argv:
        return 0  # pydantic accepts typing.TypedDict there
    path = Path(argv[0]) if argv else installed_file()
    text = path.read_text()
    patched = patch_text(text)
    if patched != text:
        path.write_text(patched)
        for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            cached.unlink()
        print(f"patched {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as e:
        print(f"patch_skyrl: {e}", file=sys.stderr)
        sys.exit(1)
