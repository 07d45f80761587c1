"""Word wrapping and truncation."""
import re


def _wrap_paragraph(text, width):
    lines, current = [], ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return "\n".join(lines)


def wrap(text, width=70):
    """Greedy word wrap to lines of at most `width` characters (longer words stay whole).

    Paragraphs are separated by blank lines in the input and stay separated by one blank
    line in the output.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    return _wrap_paragraph(text, width)


def truncate(text, width, suffix="..."):
    """Cut `text` to at most `width` characters, ending with `suffix` when it was cut."""
    if width < len(suffix):
        raise ValueError(f"width {width} is shorter than the suffix {suffix!r}")
    if len(text) < width:
        return text
    return text[: width - len(suffix)].rstrip() + suffix


def dedent_lines(text):
    """Remove the common leading whitespace of all non-blank lines."""
    lines = text.splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(re.sub(r"\s+$", "", line[cut:]) for line in lines)
