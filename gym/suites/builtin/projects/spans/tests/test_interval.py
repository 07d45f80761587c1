import pytest

from spans import Interval


def test_length_and_empty():
    assert Interval(1, 5).length == 4
    assert Interval(2, 2).is_empty()


def test_contains_inner_points():
    assert 3 in Interval(1, 5)
    assert 1 in Interval(1, 5)
    assert 0 not in Interval(1, 5)


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(4, 8))
    assert not Interval(1, 3).overlaps(Interval(5, 8))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(5, 6)) is None


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        Interval(5, 1)


def test_shift():
    assert Interval(1, 2).shift(10) == Interval(11, 12)
