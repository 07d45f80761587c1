import pytest

from textkit import truncate, wrap
from textkit.wrap import dedent_lines


def test_wrap_greedy():
    assert wrap("the quick brown fox", 10) == "the quick\nbrown fox"


def test_wrap_keeps_long_words_whole():
    assert wrap("a extraordinarily b", 5) == "a\nextraordinarily\nb"


def test_wrap_rejects_bad_width():
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_truncate_cuts_with_suffix():
    assert truncate("hello world", 8) == "hello..."


def test_truncate_short_text_unchanged():
    assert truncate("hi", 10) == "hi"


def test_dedent_lines():
    assert dedent_lines("    a\n      b\n") == "a\n  b"
