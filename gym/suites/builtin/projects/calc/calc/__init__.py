"""calc: parse and evaluate arithmetic expressions."""
from calc.errors import CalcError
from calc.evaluator import evaluate
from calc.lexer import tokenize
from calc.parser import parse

__all__ = ["CalcError", "Calculator", "calculate", "evaluate", "parse", "tokenize"]
__version__ = "0.9.0"


def calculate(text, variables=None):
    """Evaluate one expression; `variables` maps names to numbers."""
    return evaluate(parse(text), dict(variables or {}))


class Calculator:
    """A session that keeps variables between lines, like a REPL."""

    def __init__(self):
        self.variables = {}

    def run(self, line):
        """Evaluate one line and return its value."""
        return calculate(line, self.variables)
