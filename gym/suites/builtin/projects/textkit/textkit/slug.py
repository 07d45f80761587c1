"""URL slugs."""
import re
import unicodedata


def slugify(text, sep="-", max_length=None):
    """Lowercase ASCII slug of `text`: accents dropped, runs of other characters become `sep`.

    'Crème Brûlée' -> 'creme-brulee'. With `max_length` the slug is cut to at most that
    many characters.
    """
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^A-Za-z0-9]+", sep, text).lower()
    if max_length is not None:
        text = text[:max_length]
    return text
