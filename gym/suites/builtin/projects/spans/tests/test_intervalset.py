from spans import Interval, IntervalSet


def test_overlapping_intervals_merge():
    s = IntervalSet([Interval(5, 8), Interval(1, 4), Interval(3, 6)])
    assert list(s) == [Interval(1, 8)]


def test_empty_intervals_dropped():
    assert len(IntervalSet([Interval(3, 3)])) == 0


def test_union_and_intersection():
    a = IntervalSet([Interval(0, 5), Interval(10, 15)])
    b = IntervalSet([Interval(4, 11)])
    assert list(a | b) == [Interval(0, 15)]
    assert list(a & b) == [Interval(4, 5), Interval(10, 11)]


def test_difference_cutting_an_end():
    a = IntervalSet([Interval(0, 10)])
    assert list(a - IntervalSet([Interval(5, 20)])) == [Interval(0, 5)]


def test_total_length_and_span():
    s = IntervalSet([Interval(0, 2), Interval(5, 9)])
    assert s.total_length == 6
    assert s.span() == Interval(0, 9)
