"""Identifier case conversion: split any identifier or phrase into words, join them back."""
import re

# A boundary sits between a lowercase letter/digit and an uppercase letter ("fooBar"), and
# before the last capital of an acronym that starts a new word ("HTTPServer" -> HTTP Server).
_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def split_words(text):
    """Split an identifier or phrase into lowercase words."""
    text = _BOUNDARY.sub(" ", text)
    return [word.lower() for word in _SEPARATORS.split(text) if word]


def snake_case(text):
    """'HTTPServerError' -> 'http_server_error'."""
    return "_".join(split_words(text))


def camel_case(text):
    """'http server error' -> 'httpServerError'."""
    words = split_words(text)
    if not words:
        return ""
    return words[0] + "".join(word.capitalize() for word in words[1:])


def pascal_case(text):
    """'http server error' -> 'HttpServerError'."""
    return "".join(word.capitalize() for word in split_words(text))
