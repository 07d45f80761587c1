import math

import pytest

from calc import CalcError, Calculator, calculate


@pytest.mark.parametrize("text, value", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 ** 3", 8),
    ("-2 ** 2", -4),
    ("8 / 2 / 2", 2),
    ("7", 7),
])
def test_arithmetic(text, value):
    assert calculate(text) == value


def test_variables_and_constants():
    assert calculate("x * 2", {"x": 3}) == 6
    assert calculate("pi") == math.pi


def test_functions():
    assert calculate("min(3, 1, 2)") == 1
    assert calculate("sqrt(16) + abs(-2)") == 6


def test_unknown_variable():
    with pytest.raises(CalcError, match="unknown variable 'y'"):
        calculate("y + 1")


def test_division_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        calculate("1 / (2 - 2)")


def test_unbalanced_parenthesis():
    with pytest.raises(CalcError):
        calculate("(1 + 2")


def test_calculator_session_uses_variables():
    calc = Calculator()
    calc.variables["rate"] = 0.5
    assert calc.run("rate * 10") == 5
