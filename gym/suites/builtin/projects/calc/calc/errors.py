"""The one error type of the package."""


class CalcError(Exception):
    """Lexing, parsing or evaluation failed. `position` is the 0-based column, if known."""

    def __init__(self, message, position=None):
        super().__init__(message)
        self.message = message
        self.position = position
