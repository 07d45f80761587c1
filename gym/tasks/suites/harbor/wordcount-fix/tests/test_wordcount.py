import wordcount


def test_mixed_whitespace():
    assert wordcount.count_words("a  b\tc\n") == 3


def test_blank():
    assert wordcount.count_words("") == 0
    assert wordcount.count_words(" \t\n ") == 0


def test_plain():
    assert wordcount.count_words("the quick brown fox") == 4
