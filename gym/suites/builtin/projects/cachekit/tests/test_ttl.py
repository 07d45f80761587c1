import pytest

from cachekit import TTLCache


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_entry_alive_before_ttl():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.put("a", 1)
    clock.now = 5
    assert cache.get("a") == 1


def test_entry_gone_well_after_ttl():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.put("a", 1)
    clock.now = 30
    assert cache.get("a") is None
    assert "a" not in cache


def test_len_drops_expired():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.put("a", 1)
    clock.now = 8
    cache.put("b", 2)
    clock.now = 15
    assert len(cache) == 1


def test_invalid_ttl():
    with pytest.raises(ValueError):
        TTLCache(0)
