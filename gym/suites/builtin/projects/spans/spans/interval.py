"""Half-open intervals [start, end) over any ordered type whose differences can be added."""
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Interval:
    """The points x with start <= x < end. start == end is the empty interval."""

    start: Any
    end: Any

    def __post_init__(self):
        if self.end < self.start:
            raise ValueError(f"interval end {self.end!r} is before its start {self.start!r}")

    @property
    def length(self):
        return self.end - self.start

    def is_empty(self):
        return self.start == self.end

    def contains(self, point):
        """Whether `point` lies in the interval (the end is excluded)."""
        return self.start <= point <= self.end

    def __contains__(self, point):
        return self.contains(point)

    def overlaps(self, other):
        """Whether the two intervals share at least one point."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other):
        """The common part, or None when there is none."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return Interval(start, end) if start < end else None

    def shift(self, delta):
        return Interval(self.start + delta, self.end + delta)

    def __str__(self):
        return f"[{self.start}, {self.end})"
