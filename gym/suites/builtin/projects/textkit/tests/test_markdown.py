from textkit import render, render_inline


def test_heading_and_paragraph():
    assert render("# Title\n\nHello *world*") == "<h1>Title</h1>\n<p>Hello <em>world</em></p>"


def test_list():
    assert render("- one\n- two") == "<ul><li>one</li><li>two</li></ul>"


def test_paragraph_lines_are_joined():
    assert render("first line\nsecond line") == "<p>first line second line</p>"


def test_inline_code_and_escaping():
    assert render_inline("use `x < y`") == "use <code>x &lt; y</code>"
