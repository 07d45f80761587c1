"""Tasks on the spans project (read by ../build.py; not installed)."""

PROJECT = "spans"

TASKS = [
    dict(
        id="spans-1",
        difficulty="trivial",
        problem_statement="""\
Adjacent intervals reported as overlapping

Intervals are half-open, so `[1, 3)` and `[3, 5)` share no point, yet:

```python
>>> Interval(1, 3).overlaps(Interval(3, 5))
True
```

The same happens for date ranges that merely follow each other: Jan 1-3 and Jan 4-6
"overlap". Expected `False` in both cases.
""",
        fix={"spans/interval.py": [("        return self.start <= other.end and other.start <= self.end\n",
                                    "        return self.start < other.end and other.start < self.end\n")]},
        tests={"tests/test_interval.py": '''

def test_touching_intervals_do_not_overlap():
    assert not Interval(1, 3).overlaps(Interval(3, 5))
    assert not Interval(3, 5).overlaps(Interval(1, 3))
    assert Interval(1, 4).overlaps(Interval(3, 5))
''', "tests/test_daterange.py": '''

def test_consecutive_date_ranges_do_not_overlap():
    a = DateRange(dt.date(2024, 1, 1), dt.date(2024, 1, 3))
    b = DateRange(dt.date(2024, 1, 4), dt.date(2024, 1, 6))
    assert not a.overlaps(b)
'''},
    ),
    dict(
        id="spans-2",
        difficulty="trivial",
        problem_statement="""\
`in` treats the end of an interval as included

```python
>>> 5 in Interval(1, 5)
True
```

Intervals are documented as half-open `[start, end)`, so the end point is not part of
the interval. This also makes `IntervalSet` membership wrong at the end of each interval.
""",
        fix={"spans/interval.py": [("        return self.start <= point <= self.end\n",
                                    "        return self.start <= point < self.end\n")]},
        tests={"tests/test_interval.py": '''

def test_end_point_excluded():
    assert 5 not in Interval(1, 5)
    assert 4.999 in Interval(1, 5)
''', "tests/test_intervalset.py": '''

def test_set_membership_excludes_ends():
    s = IntervalSet([Interval(1, 5), Interval(8, 9)])
    assert 5 not in s and 9 not in s and 8 in s
'''},
    ),
    dict(
        id="spans-3",
        difficulty="easy",
        problem_statement="""\
IntervalSet does not merge touching intervals

The class docstring says a set is normalised so that no two intervals touch, but:

```python
>>> IntervalSet([Interval(0, 3), Interval(3, 5)])
IntervalSet([[0, 3), [3, 5)])
```

so two sets covering the same points compare unequal:

```python
>>> IntervalSet([Interval(0, 3), Interval(3, 5)]) == IntervalSet([Interval(0, 5)])
False
```
""",
        fix={"spans/intervalset.py": [("        if merged and iv.start < merged[-1].end:\n",
                                       "        if merged and iv.start <= merged[-1].end:\n")]},
        tests={"tests/test_intervalset.py": '''

def test_touching_intervals_merge():
    s = IntervalSet([Interval(0, 3), Interval(3, 5)])
    assert len(s) == 1
    assert s == IntervalSet([Interval(0, 5)])


def test_union_of_adjacent_sets():
    a = IntervalSet([Interval(0, 2)])
    b = IntervalSet([Interval(2, 4), Interval(6, 7)])
    assert list(a | b) == [Interval(0, 4), Interval(6, 7)]
'''},
    ),
    dict(
        id="spans-4",
        difficulty="easy",
        problem_statement="""\
Subtracting an inner interval loses the right-hand part

```python
>>> IntervalSet([Interval(0, 10)]) - IntervalSet([Interval(3, 5)])
IntervalSet([[0, 3)])
```

Expected `IntervalSet([[0, 3), [5, 10)])`: removing a hole from the middle of an
interval must keep both sides.
""",
        fix={"spans/intervalset.py": [("                    elif cut.end < piece.end:\n",
                                       "                    if cut.end < piece.end:\n")]},
        tests={"tests/test_intervalset.py": '''

def test_difference_splits_interval():
    a = IntervalSet([Interval(0, 10)])
    assert list(a - IntervalSet([Interval(3, 5)])) == [Interval(0, 3), Interval(5, 10)]


def test_difference_with_several_holes():
    a = IntervalSet([Interval(0, 20)])
    holes = IntervalSet([Interval(2, 4), Interval(10, 12)])
    assert list(a - holes) == [Interval(0, 2), Interval(4, 10), Interval(12, 20)]
'''},
    ),
    dict(
        id="spans-5",
        difficulty="easy",
        problem_statement="""\
Iterating a DateRange skips its last day

`DateRange` is inclusive (`len()` counts both ends) but iterating it stops one day early:

```python
>>> r = DateRange(date(2024, 1, 1), date(2024, 1, 3))
>>> len(r), len(list(r))
(3, 2)
```

Because of this `business_days()` of Monday 2024-01-01 to Friday 2024-01-05 returns 4
instead of 5.
""",
        fix={"spans/daterange.py": [("        while day < self.last:\n", "        while day <= self.last:\n")]},
        tests={"tests/test_daterange.py": '''

def test_iteration_includes_last_day():
    r = DateRange(dt.date(2024, 1, 1), dt.date(2024, 1, 3))
    assert list(r) == [dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)]


def test_business_days_of_a_work_week():
    assert DateRange(dt.date(2024, 1, 1), dt.date(2024, 1, 5)).business_days() == 5
    assert DateRange(dt.date(2024, 1, 1), dt.date(2024, 1, 7)).business_days() == 5


def test_single_day_range_iterates_once():
    day = dt.date(2024, 2, 29)
    assert list(DateRange(day, day)) == [day]
'''},
    ),
    dict(
        id="spans-6",
        difficulty="hard",
        problem_statement="""\
Feature request: gaps between intervals

For scheduling we need the free time between busy intervals. Please add:

* `Interval.gap(other)`: the interval strictly between two intervals that neither
  overlap nor touch, in either order; `None` when they overlap or touch.
* `IntervalSet.gaps()`: an `IntervalSet` of the holes between consecutive intervals.

```python
>>> Interval(1, 3).gap(Interval(5, 8))
Interval(start=3, end=5)
>>> IntervalSet([Interval(0, 2), Interval(4, 5), Interval(9, 10)]).gaps()
IntervalSet([[2, 4), [5, 9)])
```
""",
        fix={
            "spans/interval.py": [
                ("    def shift(self, delta):\n",
                 "    def gap(self, other):\n"
                 "        \"\"\"The interval strictly between two disjoint, non-touching intervals, else None.\"\"\"\n"
                 "        if self.end < other.start:\n            return Interval(self.end, other.start)\n"
                 "        if other.end < self.start:\n            return Interval(other.end, self.start)\n"
                 "        return None\n\n    def shift(self, delta):\n"),
            ],
            "spans/intervalset.py": [
                ("    def union(self, other):\n",
                 "    def gaps(self):\n        \"\"\"The holes between consecutive intervals.\"\"\"\n"
                 "        pairs = zip(self._intervals, self._intervals[1:])\n"
                 "        return IntervalSet(g for g in (a.gap(b) for a, b in pairs) if g is not None)\n\n"
                 "    def union(self, other):\n"),
            ],
        },
        tests={"tests/test_interval.py": '''

def test_gap_between_intervals():
    assert Interval(1, 3).gap(Interval(5, 8)) == Interval(3, 5)
    assert Interval(5, 8).gap(Interval(1, 3)) == Interval(3, 5)
    assert Interval(1, 4).gap(Interval(3, 8)) is None
''', "tests/test_intervalset.py": '''

def test_gaps_of_a_set():
    s = IntervalSet([Interval(0, 2), Interval(4, 5), Interval(9, 10)])
    assert s.gaps() == IntervalSet([Interval(2, 4), Interval(5, 9)])
    assert len(IntervalSet([Interval(0, 1)]).gaps()) == 0
'''},
    ),
    dict(
        id="spans-7",
        difficulty="medium",
        problem_statement="""\
IntervalSet.total_length crashes for datetime intervals

```python
>>> from datetime import datetime
>>> busy = IntervalSet([Interval(datetime(2024, 1, 1, 9), datetime(2024, 1, 1, 12))])
>>> busy.total_length
TypeError: unsupported operand type(s) for +: 'int' and 'datetime.timedelta'
```

`Interval` works with any ordered type, so `total_length` should too: for datetime
intervals it should be a `timedelta`. An empty set can keep returning `0`.
""",
        fix={"spans/intervalset.py": [
            ("        return sum(iv.length for iv in self._intervals)\n",
             "        lengths = [iv.length for iv in self._intervals]\n"
             "        if not lengths:\n            return 0\n"
             "        total = lengths[0]\n        for length in lengths[1:]:\n            total = total + length\n"
             "        return total\n"),
        ]},
        tests={"tests/test_intervalset.py": '''

def test_total_length_of_datetime_intervals():
    import datetime as dt

    day = dt.datetime(2024, 1, 1)
    busy = IntervalSet([Interval(day.replace(hour=9), day.replace(hour=12)),
                        Interval(day.replace(hour=14), day.replace(hour=15))])
    assert busy.total_length == dt.timedelta(hours=4)


def test_total_length_of_empty_set():
    assert IntervalSet().total_length == 0
'''},
    ),
]
