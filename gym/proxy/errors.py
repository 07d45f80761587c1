"""One error type for everything the proxy refuses; each dialect formats it its own way.

A `ProxyError` always carries an HTTP status (4xx for bad input, 5xx only for engine
failures) and a message that names the offending field, so a harness author can fix the
request from the message alone.
"""
from __future__ import annotations


class ProxyError(Exception):
    """A request the proxy answers with `status` and a clear `message`."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param)
