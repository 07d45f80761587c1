"""memoize: cache a function's results by its arguments."""
import functools

from cachekit.lru import LRUCache

_MISSING = object()


def make_key(args, kwargs):
    """A hashable key for one call."""
    return args + tuple(kwargs.values())


def memoize(maxsize=128):
    """Decorator: remember up to `maxsize` results (least recently used evicted first)."""

    def decorator(function):
        cache = LRUCache(maxsize)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            key = make_key(args, kwargs)
            result = cache.get(key, _MISSING)
            if result is _MISSING:
                result = function(*args, **kwargs)
                cache.put(key, result)
            return result

        wrapper.cache = cache
        wrapper.cache_clear = cache.clear
        return wrapper

    return decorator
