import pytest

from calc import CalcError, tokenize


def test_tokens():
    kinds = [t.kind for t in tokenize("max(x, 2.5) ** 2")]
    assert kinds == ["NAME", "LPAREN", "NAME", "COMMA", "NUMBER", "RPAREN", "OP", "NUMBER", "EOF"]


def test_token_positions():
    assert [t.pos for t in tokenize("1 + 23")] == [0, 2, 4, 6]


def test_bad_character_reports_column():
    with pytest.raises(CalcError) as info:
        tokenize("2 $ 3")
    assert info.value.position == 2
