"""A tiny Markdown subset: ATX headings, '-' / '*' bullet lists, paragraphs, and inline
`code`, **strong** and *emphasis*. Output is HTML, one block per line."""
import html
import re

_HEADING = re.compile(r"^(#{1,6})\s*(.+)$")
_CODE = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"\*(.+?)\*")


def render_inline(text):
    """Escape HTML and render inline markup."""
    text = html.escape(text, quote=False)
    text = _CODE.sub(r"<code>\1</code>", text)
    text = _EM.sub(r"<em>\1</em>", text)
    text = _STRONG.sub(r"<strong>\1</strong>", text)
    return text


def render(text):
    """Render a Markdown document to HTML."""
    blocks, paragraph, items = [], [], []

    def flush_paragraph():
        if paragraph:
            blocks.append("<p>" + render_inline(" ".join(paragraph)) + "</p>")
            paragraph.clear()

    def flush_list():
        if items:
            blocks.append("<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            flush_paragraph()
            flush_list()
            continue
        heading = _HEADING.match(stripped)
        if heading:
            flush_paragraph()
            flush_list()
            level = len(heading.group(1))
            blocks.append(f"<h{level}>{render_inline(heading.group(2).strip())}</h{level}>")
        elif stripped.startswith(("- ", "* ")):
            flush_paragraph()
            items.append(render_inline(stripped[2:].strip()))
        else:
            flush_list()
            paragraph.append(stripped)
    flush_paragraph()
    flush_list()
    return "\n".join(blocks)
