"""Tasks on the textkit project (read by ../build.py; not installed)."""

PROJECT = "textkit"

TASKS = [
    dict(
        id="textkit-1",
        difficulty="trivial",
        problem_statement="""\
truncate() cuts text that already fits exactly

`truncate(text, width)` should leave text alone when it is at most `width` characters
long, but a string whose length equals `width` is still cut:

```python
>>> from textkit import truncate
>>> truncate("hello", 5)
'he...'
```

Expected `'hello'`, since the text already fits in 5 characters.
""",
        fix={"textkit/wrap.py": [("    if len(text) < width:\n", "    if len(text) <= width:\n")]},
        tests={"tests/test_wrap.py": '''

def test_truncate_text_of_exact_width_unchanged():
    assert truncate("hello", 5) == "hello"
    assert truncate("hello!", 5) == "he..."
'''},
    ),
    dict(
        id="textkit-2",
        difficulty="easy",
        problem_statement="""\
slugify() leaves separators at the start and end of the slug

Titles that start or end with punctuation or spaces produce slugs with a leading or
trailing dash:

```python
>>> slugify("  Hello, World!  ")
'-hello-world-'
>>> slugify("hello world", max_length=6)
'hello-'
```

A slug should never start or end with the separator: expected `'hello-world'` and
`'hello'`.
""",
        fix={"textkit/slug.py": [
            ("    text = re.sub(r\"[^A-Za-z0-9]+\", sep, text).lower()\n"
             "    if max_length is not None:\n        text = text[:max_length]\n    return text\n",
             "    text = re.sub(r\"[^A-Za-z0-9]+\", sep, text).lower().strip(sep)\n"
             "    if max_length is not None:\n        text = text[:max_length].rstrip(sep)\n    return text\n"),
        ]},
        tests={"tests/test_slug.py": '''

def test_slugify_strips_separators_at_the_ends():
    assert slugify("  Hello, World!  ") == "hello-world"
    assert slugify("--a--") == "a"


def test_slugify_max_length_does_not_end_with_separator():
    assert slugify("hello world", max_length=6) == "hello"
'''},
    ),
    dict(
        id="textkit-3",
        difficulty="easy",
        problem_statement="""\
word_count() splits contractions and hyphenated words

```python
>>> word_count("don't stop")
3
>>> word_count("a state-of-the-art design")
6
```

Contractions (`don't`) and hyphenated compounds (`state-of-the-art`) are one word each;
expected 2 and 3. `word_frequencies` has the same problem since it shares the word
pattern.
""",
        fix={"textkit/stats.py": [('_WORD = re.compile(r"\\w+")\n', '_WORD = re.compile(r"\\w+(?:[\'-]\\w+)*")\n')]},
        tests={"tests/test_stats.py": '''

def test_word_count_keeps_contractions_and_compounds_whole():
    assert word_count("don't stop") == 2
    assert word_count("a state-of-the-art design") == 3


def test_word_frequencies_contractions():
    assert word_frequencies("Don't panic, don't") == {"don't": 2, "panic": 1}
'''},
    ),
    dict(
        id="textkit-4",
        difficulty="medium",
        problem_statement="""\
wrap() merges paragraphs

The docstring of `wrap()` says paragraphs separated by blank lines stay separated, but
they are merged into one block of lines:

```python
>>> print(wrap("first paragraph here\\n\\nsecond one", 10))
first
paragraph
here
second one
```

Expected the two paragraphs to be wrapped separately with one blank line between them:

```
first
paragraph
here

second one
```
""",
        fix={"textkit/wrap.py": [
            ("    return _wrap_paragraph(text, width)\n",
             "    paragraphs = [p for p in re.split(r\"\\n\\s*\\n\", text) if p.strip()]\n"
             "    return \"\\n\\n\".join(_wrap_paragraph(p, width) for p in paragraphs)\n"),
        ]},
        tests={"tests/test_wrap.py": '''

def test_wrap_keeps_paragraphs_separate():
    assert wrap("first paragraph here\\n\\nsecond one", 10) == "first\\nparagraph\\nhere\\n\\nsecond one"


def test_wrap_collapses_many_blank_lines_between_paragraphs():
    assert wrap("a b\\n\\n\\n  \\nc", 80) == "a b\\n\\nc"
'''},
    ),
    dict(
        id="textkit-5",
        difficulty="easy",
        problem_statement="""\
**bold** text renders as broken emphasis

```python
>>> render_inline("**bold** and *it*")
'<em>*bold</em>* and <em>it</em>'
```

Expected `'<strong>bold</strong> and <em>it</em>'`. Strong emphasis must be recognised
before single-asterisk emphasis.
""",
        fix={"textkit/markdown.py": [
            ("    text = _EM.sub(r\"<em>\\1</em>\", text)\n    text = _STRONG.sub(r\"<strong>\\1</strong>\", text)\n",
             "    text = _STRONG.sub(r\"<strong>\\1</strong>\", text)\n    text = _EM.sub(r\"<em>\\1</em>\", text)\n"),
        ]},
        tests={"tests/test_markdown.py": '''

def test_strong_before_emphasis():
    assert render_inline("**bold** and *it*") == "<strong>bold</strong> and <em>it</em>"


def test_strong_in_heading():
    assert render("## A **big** deal") == "<h2>A <strong>big</strong> deal</h2>"
'''},
    ),
    dict(
        id="textkit-6",
        difficulty="hard",
        problem_statement="""\
Add kebab_case() and export it from the package

We have `snake_case`, `camel_case` and `pascal_case`, but no kebab case, which we need
for CSS class names and CLI flags:

```python
>>> from textkit import kebab_case
ImportError: cannot import name 'kebab_case' from 'textkit'
```

Please add `kebab_case` next to the other converters (same word splitting rules) and
export it from `textkit`:

```python
>>> kebab_case("HTTPServerError")
'http-server-error'
>>> kebab_case("user_account id")
'user-account-id'
```
""",
        fix={
            "textkit/case.py": [
                ("def camel_case(text):\n",
                 "def kebab_case(text):\n    \"\"\"'HTTPServerError' -> 'http-server-error'.\"\"\"\n"
                 "    return \"-\".join(split_words(text))\n\n\ndef camel_case(text):\n"),
            ],
            "textkit/__init__.py": [
                ("from textkit.case import camel_case, pascal_case, snake_case, split_words\n",
                 "from textkit.case import camel_case, kebab_case, pascal_case, snake_case, split_words\n"),
                ('    "camel_case", "pascal_case",', '    "camel_case", "kebab_case", "pascal_case",'),
            ],
        },
        tests={"tests/test_case.py": '''

def test_kebab_case():
    from textkit import kebab_case

    assert kebab_case("HTTPServerError") == "http-server-error"
    assert kebab_case("user_account id") == "user-account-id"
    assert kebab_case("") == ""


def test_kebab_case_is_exported():
    import textkit

    assert "kebab_case" in textkit.__all__
'''},
    ),
    dict(
        id="textkit-7",
        difficulty="trivial",
        problem_statement="""\
A line starting with a hashtag becomes a heading

```python
>>> render("#hashtag is not a heading")
'<h1>hashtag is not a heading</h1>'
```

In Markdown an ATX heading needs at least one space after the `#` characters. Expected
`'<p>#hashtag is not a heading</p>'`.
""",
        fix={"textkit/markdown.py": [('_HEADING = re.compile(r"^(#{1,6})\\s*(.+)$")\n',
                                      '_HEADING = re.compile(r"^(#{1,6})\\s+(.+)$")\n')]},
        tests={"tests/test_markdown.py": '''

def test_hash_without_space_is_not_a_heading():
    assert render("#hashtag is not a heading") == "<p>#hashtag is not a heading</p>"


def test_heading_levels():
    assert render("### Three") == "<h3>Three</h3>"
'''},
    ),
]
