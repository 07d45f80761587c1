"""spans: intervals, interval sets and date ranges."""
from spans.daterange import DateRange
from spans.interval import Interval
from spans.intervalset import IntervalSet

__all__ = ["DateRange", "Interval", "IntervalSet"]
__version__ = "1.2.0"
