from textkit import slugify


def test_slugify_basic():
    assert slugify("Hello World") == "hello-world"


def test_slugify_drops_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_slugify_custom_separator():
    assert slugify("a b c", sep="_") == "a_b_c"
