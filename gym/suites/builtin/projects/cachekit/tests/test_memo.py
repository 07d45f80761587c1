from cachekit import memoize


def test_memoize_caches_results():
    calls = []

    @memoize()
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9
    assert square(3) == 9
    assert calls == [3]


def test_memoize_keeps_metadata():
    @memoize()
    def documented(x):
        """Docs."""
        return x

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."


def test_cache_clear():
    calls = []

    @memoize()
    def f(x):
        calls.append(x)
        return x

    f(1)
    f.cache_clear()
    f(1)
    assert calls == [1, 1]
