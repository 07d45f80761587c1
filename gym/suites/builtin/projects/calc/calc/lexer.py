"""Turn an expression string into tokens."""
import re
from dataclasses import dataclass

from calc.errors import CalcError


@dataclass(frozen=True)
class Token:
    kind: str
    """NUMBER, NAME, OP, LPAREN, RPAREN, COMMA or EOF."""
    text: str
    pos: int
    """0-based column of the token's first character."""


_TOKEN = re.compile(r"""
    (?P<NUMBER>\d+(?:\.\d*)?)
  | (?P<NAME>[A-Za-z_]\w*)
  | (?P<OP>\*\*|[-+*/=])
  | (?P<LPAREN>\()
  | (?P<RPAREN>\))
  | (?P<COMMA>,)
  | (?P<WS>\s+)
""", re.VERBOSE)


def tokenize(text):
    """List of tokens, always ending with an EOF token."""
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise CalcError(f"unexpected character {text[pos]!r} at column {pos + 1}", pos)
        if match.lastgroup != "WS":
            tokens.append(Token(match.lastgroup, match.group(), pos))
        pos = match.end()
    tokens.append(Token("EOF", "", len(text)))
    return tokens
