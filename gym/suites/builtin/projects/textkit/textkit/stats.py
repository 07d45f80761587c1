"""Word statistics."""
import math
import re
from collections import Counter

_WORD = re.compile(r"\w+")


def words(text):
    """The words of `text`, in order."""
    return _WORD.findall(text)


def word_count(text):
    """Number of words in `text`."""
    return len(words(text))


def word_frequencies(text):
    """Case-insensitive word -> count."""
    return dict(Counter(word.lower() for word in words(text)))


def reading_time(text, words_per_minute=200):
    """Whole minutes needed to read `text` (at least 1 if there is any word)."""
    count = word_count(text)
    if count == 0:
        return 0
    return max(1, math.ceil(count / words_per_minute))
