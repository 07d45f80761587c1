"""Text of a reply while it streams: ids decoded incrementally, and how much of the text may
be shown yet (held back where a stop string or a tool call may be starting)."""
from __future__ import annotations

from .render import Renderer


class Detokenizer:
    """Incremental decode (prefix/read offsets) so streaming stays linear in output length."""

    def __init__(self, renderer: Renderer):
        self.r, self.ids, self.prefix, self.read = renderer, [], 0, 0

    def add(self, ids: list[int]) -> str:
        self.ids += ids
        before = self.r.decode(self.ids[self.prefix:self.read])
        after = self.r.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""


def safe_len(text: str, markers: list[str]) -> tuple[int, bool]:
    """How much of `text` can be shown: up to the first marker, or a marker's partial start."""
    cut, hit = len(text), False
    for m in markers:
        i = text.find(m)
        if i >= 0:
            cut, hit = min(cut, i), True
            continue
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                cut = min(cut, len(text) - k)
                break
    return cut, hit
