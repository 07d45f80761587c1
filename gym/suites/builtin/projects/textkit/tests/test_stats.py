from textkit import reading_time, word_count, word_frequencies


def test_word_count():
    assert word_count("one two  three") == 3
    assert word_count("") == 0


def test_word_frequencies_case_insensitive():
    assert word_frequencies("A b a") == {"a": 2, "b": 1}


def test_reading_time():
    assert reading_time("word " * 450) == 3
    assert reading_time("") == 0
