"""Inclusive ranges of calendar dates."""
import datetime as dt

from spans.interval import Interval

ONE_DAY = dt.timedelta(days=1)


class DateRange:
    """All dates from `first` to `last`, both included."""

    def __init__(self, first, last):
        if last < first:
            raise ValueError(f"date range ends ({last}) before it starts ({first})")
        self.first, self.last = first, last

    @classmethod
    def parse(cls, text):
        """Parse 'YYYY-MM-DD..YYYY-MM-DD'."""
        first, sep, last = text.partition("..")
        if not sep:
            raise ValueError(f"expected 'YYYY-MM-DD..YYYY-MM-DD', got {text!r}")
        return cls(dt.date.fromisoformat(first.strip()), dt.date.fromisoformat(last.strip()))

    def __len__(self):
        return (self.last - self.first).days + 1

    def __eq__(self, other):
        return isinstance(other, DateRange) and (self.first, self.last) == (other.first, other.last)

    def __repr__(self):
        return f"DateRange({self.first.isoformat()}..{self.last.isoformat()})"

    def __contains__(self, day):
        return self.first <= day <= self.last

    def days(self, step=1):
        """Iterate over the dates of the range, every `step` days."""
        day = self.first
        while day < self.last:
            yield day
            day += dt.timedelta(days=step)

    def __iter__(self):
        return self.days()

    def business_days(self):
        """Number of Monday-to-Friday dates in the range."""
        return sum(1 for day in self.days() if day.weekday() < 5)

    def to_interval(self):
        """The equivalent half-open interval [first, last + 1 day)."""
        return Interval(self.first, self.last + ONE_DAY)

    def overlaps(self, other):
        return self.to_interval().overlaps(other.to_interval())
