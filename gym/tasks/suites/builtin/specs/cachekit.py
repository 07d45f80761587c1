"""Tasks on the cachekit project (read by ../build.py; not installed)."""

PROJECT = "cachekit"

TASKS = [
    dict(
        id="cachekit-1",
        difficulty="easy",
        problem_statement="""\
LRUCache.get() does not count as a use

The class promises that *reading or writing* an entry makes it the most recent, but only
`put()` does. Reading an entry leaves it first in line for eviction:

```python
>>> cache = LRUCache(10)
>>> for k in "abc":
...     cache.put(k, k)
>>> cache.get("a")
'a'
>>> cache.keys()        # least to most recently used
['a', 'b', 'c']
```

Expected `['b', 'c', 'a']`; `cache["b"]` should likewise move `b` to the end.
""",
        fix={"cachekit/lru.py": [("            self.hits += 1\n            return self._data[key]\n",
                                  "            self.hits += 1\n            self._data.move_to_end(key)\n"
                                  "            return self._data[key]\n")]},
        tests={"tests/test_lru.py": '''

def test_get_refreshes_recency():
    cache = LRUCache(10)
    for k in "abc":
        cache.put(k, k)
    cache.get("a")
    assert cache.keys() == ["b", "c", "a"]
    cache["b"]
    assert cache.keys() == ["c", "a", "b"]
'''},
    ),
    dict(
        id="cachekit-2",
        difficulty="trivial",
        problem_statement="""\
LRUCache holds one entry fewer than maxsize

```python
>>> cache = LRUCache(2)
>>> cache.put("a", 1); cache.put("b", 2)
>>> len(cache), "a" in cache
(1, False)
```

A cache with `maxsize=2` should keep two entries; with `maxsize=1` it currently cannot
keep anything at all.
""",
        fix={"cachekit/lru.py": [("        if len(self._data) >= self.maxsize:\n",
                                  "        if len(self._data) > self.maxsize:\n")]},
        tests={"tests/test_lru.py": '''

def test_holds_exactly_maxsize_entries():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert len(cache) == 2 and "a" in cache
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]


def test_maxsize_one_keeps_the_last_entry():
    cache = LRUCache(1)
    cache.put("a", 1)
    assert cache.get("a") == 1
'''},
    ),
    dict(
        id="cachekit-3",
        difficulty="trivial",
        problem_statement="""\
TTLCache entries live one tick too long

An entry stored at t=0 with `ttl=10` should be gone at t=10 ("expire `ttl` seconds after
they were stored"), but it is still returned at exactly t=10 and only disappears after.
""",
        fix={"cachekit/ttl.py": [("        return now > expires_at\n", "        return now >= expires_at\n")]},
        tests={"tests/test_ttl.py": '''

def test_entry_expires_exactly_at_ttl():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.put("a", 1)
    clock.now = 9.5
    assert cache.get("a") == 1
    clock.now = 10
    assert cache.get("a") is None
'''},
    ),
    dict(
        id="cachekit-4",
        difficulty="medium",
        problem_statement="""\
memoize mixes up calls that differ only in keyword names

```python
@memoize()
def place(x, scale=1, offset=0):
    return x * scale + offset

place(2, scale=5)    # 10
place(2, offset=5)   # returns 10 again, should be 7
```

The cache key uses the keyword *values* but not their names. Calls that pass the same
keywords in a different order (`f(a=5, b=2)` vs `f(b=2, a=5)`) should share one entry.
""",
        fix={"cachekit/memo.py": [
            ("_MISSING = object()\n", "_MISSING = object()\n_KWARGS = object()  # separates positional from keyword parts of a key\n"),
            ("    \"\"\"A hashable key for one call.\"\"\"\n    return args + tuple(kwargs.values())\n",
             "    \"\"\"A hashable key for one call; keywords count by name, in any order.\"\"\"\n"
             "    if not kwargs:\n        return args\n"
             "    return args + (_KWARGS,) + tuple(sorted(kwargs.items()))\n"),
        ]},
        tests={"tests/test_memo.py": '''

def test_keyword_names_are_part_of_the_key():
    @memoize()
    def place(x, scale=1, offset=0):
        return x * scale + offset

    assert place(2, scale=5) == 10
    assert place(2, offset=5) == 7


def test_keyword_order_does_not_matter():
    calls = []

    @memoize()
    def f(a=0, b=0):
        calls.append((a, b))
        return a - b

    assert f(a=5, b=2) == 3
    assert f(b=2, a=5) == 3
    assert len(calls) == 1
'''},
    ),
    dict(
        id="cachekit-5",
        difficulty="medium",
        problem_statement="""\
memoized functions need cache_info(), and cache_clear() should reset statistics

To size our caches we need `functools.lru_cache`-style statistics on memoized functions:

```python
@memoize(maxsize=32)
def f(x): ...

f(1); f(1); f(2)
f.cache_info()   # AttributeError; want CacheInfo(hits=1, misses=2, maxsize=32, currsize=2)
```

Please add an `LRUCache.info()` returning a `CacheInfo(hits, misses, maxsize, currsize)`
named tuple and expose it as `cache_info` on memoized functions. Also,
`LRUCache.clear()` (and so `cache_clear()`) should reset the hit/miss counters, as
`functools` does.
""",
        fix={
            "cachekit/lru.py": [
                ("from collections import OrderedDict\n",
                 "from collections import OrderedDict, namedtuple\n\n"
                 "CacheInfo = namedtuple(\"CacheInfo\", [\"hits\", \"misses\", \"maxsize\", \"currsize\"])\n"),
                ("    def clear(self):\n        self._data.clear()\n",
                 "    def info(self):\n        return CacheInfo(self.hits, self.misses, self.maxsize, len(self._data))\n\n"
                 "    def clear(self):\n        \"\"\"Drop every entry and reset the statistics.\"\"\"\n"
                 "        self._data.clear()\n        self.hits = 0\n        self.misses = 0\n"),
            ],
            "cachekit/memo.py": [
                ("        wrapper.cache_clear = cache.clear\n",
                 "        wrapper.cache_clear = cache.clear\n        wrapper.cache_info = cache.info\n"),
            ],
        },
        tests={"tests/test_memo.py": '''

def test_cache_info_like_functools():
    @memoize(maxsize=32)
    def f(x):
        return x

    f(1)
    f(1)
    f(2)
    info = f.cache_info()
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (1, 2, 32, 2)


def test_cache_clear_resets_statistics():
    @memoize()
    def f(x):
        return x

    f(1)
    f(1)
    f.cache_clear()
    assert tuple(f.cache_info()) == (0, 0, 128, 0)
''', "tests/test_lru.py": '''

def test_clear_resets_counters():
    cache = LRUCache(10)
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    cache.clear()
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)
'''},
    ),
    dict(
        id="cachekit-6",
        difficulty="hard",
        problem_statement="""\
memoize(ttl=...): results that expire

Some of our memoized lookups go stale. Please let `memoize` take `ttl` (seconds) and a
`clock` (default `time.monotonic`) so results are recomputed once they are older than
`ttl`. The size bound must still hold, so `TTLCache` needs a `maxsize` too (default
`None`, unbounded): when a put makes it exceed `maxsize`, drop expired entries and then,
if still too big, the entry stored longest ago.

```python
@memoize(maxsize=2, ttl=10, clock=clock)
def lookup(key): ...
```
""",
        fix={
            "cachekit/ttl.py": [
                ("    def __init__(self, ttl, clock=time.monotonic):\n",
                 "    def __init__(self, ttl, clock=time.monotonic, maxsize=None):\n"),
                ("        self.clock = clock\n", "        self.clock = clock\n        self.maxsize = maxsize\n"),
                ("        self._data[key] = (self.clock() + self.ttl, value)\n",
                 "        self._data[key] = (self.clock() + self.ttl, value)\n"
                 "        if self.maxsize is not None and len(self._data) > self.maxsize:\n"
                 "            self.expire()\n"
                 "            while len(self._data) > self.maxsize:\n"
                 "                del self._data[min(self._data, key=lambda k: self._data[k][0])]\n"),
            ],
            "cachekit/memo.py": [
                ("import functools\n\nfrom cachekit.lru import LRUCache\n",
                 "import functools\nimport time\n\nfrom cachekit.lru import LRUCache\nfrom cachekit.ttl import TTLCache\n"),
                ("def memoize(maxsize=128):\n    \"\"\"Decorator: remember up to `maxsize` results (least recently used evicted first).\"\"\"\n",
                 "def memoize(maxsize=128, ttl=None, clock=time.monotonic):\n"
                 "    \"\"\"Decorator: remember up to `maxsize` results (least recently used evicted first).\n\n"
                 "    With `ttl`, a result is recomputed once it is `ttl` seconds old (per `clock`).\n    \"\"\"\n"),
                ("        cache = LRUCache(maxsize)\n",
                 "        cache = LRUCache(maxsize) if ttl is None else TTLCache(ttl, clock=clock, maxsize=maxsize)\n"),
            ],
        },
        tests={"tests/test_memo.py": '''

def test_memoize_with_ttl_recomputes_stale_results():
    now = [0.0]
    calls = []

    @memoize(ttl=10, clock=lambda: now[0])
    def double(x):
        calls.append(x)
        return 2 * x

    assert double(1) == 2
    now[0] = 5
    assert double(1) == 2
    now[0] = 11
    assert double(1) == 2
    assert calls == [1, 1]


def test_memoize_with_ttl_keeps_the_size_bound():
    @memoize(maxsize=2, ttl=100, clock=lambda: 0.0)
    def ident(x):
        return x

    for i in range(5):
        ident(i)
    assert len(ident.cache) == 2
''', "tests/test_ttl.py": '''

def test_maxsize_evicts_the_oldest_entry():
    clock = FakeClock()
    cache = TTLCache(100, clock=clock, maxsize=2)
    cache.put("a", 1)
    clock.now = 1
    cache.put("b", 2)
    clock.now = 2
    cache.put("c", 3)
    assert "a" not in cache and "b" in cache and "c" in cache
'''},
    ),
]
