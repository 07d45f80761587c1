import pytest

from cachekit import LRUCache


def test_put_and_get():
    cache = LRUCache(10)
    cache.put("a", 1)
    cache["b"] = 2
    assert cache.get("a") == 1 and cache["b"] == 2
    assert cache.get("zzz", "default") == "default"


def test_missing_key_raises():
    with pytest.raises(KeyError):
        LRUCache(10)["nope"]


def test_size_stays_bounded():
    cache = LRUCache(3)
    for i in range(10):
        cache.put(i, i)
    assert len(cache) <= 3
    assert 9 in cache


def test_hit_and_miss_counters():
    cache = LRUCache(10)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.hits, cache.misses) == (1, 1)


def test_invalid_maxsize():
    with pytest.raises(ValueError):
        LRUCache(0)
