"""Immutable sets of disjoint, sorted half-open intervals with set algebra."""
from spans.interval import Interval


def _normalise(intervals):
    """Sort, drop empty intervals and merge the ones that overlap or touch."""
    merged = []
    for iv in sorted(iv for iv in intervals if not iv.is_empty()):
        if merged and iv.start < merged[-1].end:
            merged[-1] = Interval(merged[-1].start, max(merged[-1].end, iv.end))
        else:
            merged.append(iv)
    return tuple(merged)


class IntervalSet:
    """A union of intervals, kept normalised: sorted, disjoint, no two touching."""

    def __init__(self, intervals=()):
        self._intervals = _normalise(intervals)

    def __iter__(self):
        return iter(self._intervals)

    def __len__(self):
        return len(self._intervals)

    def __bool__(self):
        return bool(self._intervals)

    def __eq__(self, other):
        return isinstance(other, IntervalSet) and self._intervals == other._intervals

    def __repr__(self):
        return "IntervalSet([" + ", ".join(map(str, self._intervals)) + "])"

    def __contains__(self, point):
        return any(point in iv for iv in self._intervals)

    @property
    def total_length(self):
        """Sum of the lengths of the intervals."""
        return sum(iv.length for iv in self._intervals)

    def span(self):
        """The smallest single interval covering the set, or None when empty."""
        if not self._intervals:
            return None
        return Interval(self._intervals[0].start, self._intervals[-1].end)

    def union(self, other):
        return IntervalSet([*self, *other])

    def intersection(self, other):
        parts = []
        for a in self:
            for b in other:
                common = a.intersection(b)
                if common is not None:
                    parts.append(common)
        return IntervalSet(parts)

    def difference(self, other):
        """Points in self that are not in other."""
        result = []
        for iv in self:
            pieces = [iv]
            for cut in other:
                next_pieces = []
                for piece in pieces:
                    if cut.end <= piece.start or cut.start >= piece.end:
                        next_pieces.append(piece)
                        continue
                    if piece.start < cut.start:
                        next_pieces.append(Interval(piece.start, cut.start))
                    elif cut.end < piece.end:
                        next_pieces.append(Interval(cut.end, piece.end))
                pieces = next_pieces
            result.extend(pieces)
        return IntervalSet(result)

    __or__ = union
    __and__ = intersection
    __sub__ = difference
