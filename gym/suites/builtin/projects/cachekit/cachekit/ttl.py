"""A cache whose entries expire `ttl` seconds after they were stored."""
import time


class TTLCache:
    """`clock` returns the current time in seconds; inject a fake one in tests."""

    def __init__(self, ttl, clock=time.monotonic):
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.ttl = ttl
        self.clock = clock
        self._data = {}  # key -> (expires_at, value)

    def _is_expired(self, expires_at, now):
        return now > expires_at

    def put(self, key, value):
        self._data[key] = (self.clock() + self.ttl, value)

    __setitem__ = put

    def get(self, key, default=None):
        item = self._data.get(key)
        if item is None:
            return default
        expires_at, value = item
        if self._is_expired(expires_at, self.clock()):
            del self._data[key]
            return default
        return value

    def __contains__(self, key):
        marker = object()
        return self.get(key, marker) is not marker

    def expire(self):
        """Drop every expired entry now."""
        now = self.clock()
        for key in [k for k, (expires_at, _) in self._data.items() if self._is_expired(expires_at, now)]:
            del self._data[key]

    def __len__(self):
        self.expire()
        return len(self._data)

    def clear(self):
        self._data.clear()
