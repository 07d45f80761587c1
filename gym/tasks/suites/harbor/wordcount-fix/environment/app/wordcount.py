"""Count the words of a text."""


def count_words(text: str) -> int:
    """Number of words in `text`."""
    return len([w for w in text.split(" ") if w != ""])
