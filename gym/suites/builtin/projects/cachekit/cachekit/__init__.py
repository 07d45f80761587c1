"""cachekit: LRU and TTL caches and a memoize decorator."""
from cachekit.lru import LRUCache
from cachekit.memo import memoize
from cachekit.ttl import TTLCache

__all__ = ["LRUCache", "TTLCache", "memoize"]
__version__ = "0.3.2"
