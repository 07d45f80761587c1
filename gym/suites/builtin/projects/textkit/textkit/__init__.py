"""textkit: small, dependency-free text utilities."""
from textkit.case import camel_case, pascal_case, snake_case, split_words
from textkit.markdown import render, render_inline
from textkit.slug import slugify
from textkit.stats import reading_time, word_count, word_frequencies
from textkit.wrap import truncate, wrap

__all__ = [
    "camel_case", "pascal_case", "snake_case", "split_words",
    "render", "render_inline", "slugify",
    "reading_time", "word_count", "word_frequencies",
    "truncate", "wrap",
]
__version__ = "0.4.1"
