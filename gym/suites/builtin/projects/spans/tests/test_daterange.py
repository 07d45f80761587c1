import datetime as dt

import pytest

from spans import DateRange, Interval


def test_parse_and_len():
    r = DateRange.parse("2024-01-01..2024-01-31")
    assert r.first == dt.date(2024, 1, 1) and r.last == dt.date(2024, 1, 31)
    assert len(r) == 31


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        DateRange.parse("2024-01-01")


def test_contains():
    r = DateRange(dt.date(2024, 3, 1), dt.date(2024, 3, 10))
    assert dt.date(2024, 3, 10) in r
    assert dt.date(2024, 3, 11) not in r


def test_to_interval():
    r = DateRange(dt.date(2024, 3, 1), dt.date(2024, 3, 2))
    assert r.to_interval() == Interval(dt.date(2024, 3, 1), dt.date(2024, 3, 3))


def test_overlapping_ranges():
    a = DateRange(dt.date(2024, 1, 1), dt.date(2024, 1, 10))
    b = DateRange(dt.date(2024, 1, 5), dt.date(2024, 1, 20))
    assert a.overlaps(b)
