"""Special-token text in message content stays text.

The only control-token ids a rendered prompt may hold are the ones the chat template wrote
itself (`<|im_start|>`, `<|im_end|>`, ...). Text a harness supplies (a tool result, a user
message, tool-call arguments, a tool list, a system prompt) can spell the same strings;
tokenized as it is, tool output could forge a turn. So the renderer *shields* the content
of every template message before the template runs: each special-token literal becomes one
reserved private-use character (a reserved character already in the content is escaped,
so shielding is exactly reversible). After rendering, the text is cut at the template's
own special tokens, and a piece that holds shielded text is restored and tokenized with
special-token matching off.

Content without special-token text renders and tokenizes exactly as it did unshielded.
Content with it tokenizes as `tokenizer(piece, split_special_tokens=True)` would, per piece
between the template's control tokens. Shielded are the control tokens: the tokenizer's
special tokens (`all_special_tokens` and added tokens marked special) and any other added
token the chat template writes itself on a plain conversation (some tokenizers ship turn
markers as non-special added tokens). Other non-special added tokens (Qwen's `<tool_call>`)
stay tokens, as under Hugging Face's `split_special_tokens`: tool formats write them into
content on purpose.
"""
from __future__ import annotations

import re
from typing import Iterable

_BASE = 0xF0000  # Supplementary Private Use Area-A: no tokenizer or template gives it meaning


def special_tokens(tokenizer) -> list[str]:
    """The tokenizer's control-token strings: its named special tokens, every added token
    flagged special, and the added tokens its chat template writes (`template_tokens`)."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        if getattr(t, "special", False):
            found.add(t.content)
    found.update(template_tokens(tokenizer))
    return sorted((s for s in found if s), key=lambda s: (-len(s), s))


_SAMPLES = ([{"role": "system", "content": "A"}, {"role": "user", "content": "B"},
             {"role": "assistant", "content": "C"}, {"role": "user", "content": "D"}],
            [{"role": "user", "content": "B"}, {"role": "assistant", "content": "C"}, {"role": "user", "content": "D"}])


def template_tokens(tokenizer) -> set[str]:
    """Added tokens (special or not) that the chat template itself writes around a plain
    conversation: its turn markers. Whitespace-only added tokens are text, never markers."""
    added = {i: t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
             if t.content.strip()}
    out: set[str] = set()
    for sample in _SAMPLES:
        try:  # some templates refuse a system turn
            text = tokenizer.apply_chat_template(sample, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - jinja raise_exception or a template's own check
            continue
        out.update(added[i] for i in tokenizer.encode(text, add_special_tokens=False) if i in added)
    return out


class Shield:
    """Reversible substitution of special-token literals in text by reserved characters."""

    def __init__(self, specials: Iterable[str]):
        self.specials = tuple(sorted({s for s in specials if s}, key=lambda s: (-len(s), s)))
        n = len(self.specials)
        if n >= 0xFFFD:
            raise ValueError(f"{n} special tokens: more than the reserved characters")
        self._to = {s: chr(_BASE + i) for i, s in enumerate(self.specials)}
        self._back = {c: s for s, c in self._to.items()}
        self.escape = chr(_BASE + n)
        reserved = f"[{chr(_BASE)}-{self.escape}]"
        literals = "|".join(re.escape(s) for s in self.specials)
        # Separate scans: a pure alternation of literals gets re's fast prefix search, and
        # `char in text` is immediate for text narrower than the reserved (astral) characters.
        self._literals = re.compile(literals) if literals else None
        self._find = re.compile(f"{literals}|{reserved}" if literals else reserved)
        self._reserved = re.compile(reserved)
        self._reserved_chars = tuple(chr(_BASE + i) for i in range(n + 1)) if n < 32 else None
        self._marks = re.compile(f"{re.escape(self.escape)}{reserved}|{reserved}")

    def shield(self, text: str) -> str:
        """`text` with each special-token literal replaced by its reserved character."""
        if not self.marked(text) and (self._literals is None or self._literals.search(text) is None):
            return text
        return self._find.sub(self._sub, text)

    def _sub(self, m: re.Match) -> str:
        g = m.group()
        return self._to.get(g) or self.escape + g

    def marked(self, text: str) -> bool:
        """Whether `text` holds shielded content (a placeholder or an escape)."""
        if text.isascii():
            return False
        if self._reserved_chars is not None:
            return any(c in text for c in self._reserved_chars)
        return self._reserved.search(text) is not None

    def restore(self, text: str) -> str:
        """The inverse of `shield`: the literal text back."""
        return self._marks.sub(lambda m: m.group()[1] if len(m.group()) == 2 else self._back.get(m.group(), ""), text)

    def pieces(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut at its placeholders: (plain text, False) and (special literal, True)
        in order, escapes restored. For tokenizers whose added tokens cannot be split out
        literally, so that each shielded literal is tokenized on its own as text."""
        out: list[tuple[str, bool]] = []
        buf: list[str] = []
        pos = 0
        for m in self._marks.finditer(text):
            buf.append(text[pos:m.start()])
            pos, g = m.end(), m.group()
            if len(g) == 2:
                buf.append(g[1])
            else:
                out.append(("".join(buf), False))
                out.append((self._back.get(g, ""), True))
                buf = []
        buf.append(text[pos:])
        out.append(("".join(buf), False))
        return [(t, s) for t, s in out if t]
