from decimal import Decimal

import pytest

from ledger import CurrencyMismatch, Money


def test_amounts_are_cents():
    assert Money("10.005").amount == Decimal("10.01")
    assert Money(3).amount == Decimal("3.00")


def test_arithmetic():
    assert Money("1.10") + Money("2.20") == Money("3.30")
    assert Money("5") - Money("7.5") == Money("-2.50")
    assert Money("2.50") * 3 == Money("7.50")


def test_currency_mismatch():
    with pytest.raises(CurrencyMismatch):
        Money(1, "USD") + Money(1, "EUR")


def test_format():
    assert Money("1234.5").format() == "$1,234.50"
    assert Money("3", "EUR").format() == "€3.00"
    assert Money("3", "CHF").format() == "CHF 3.00"
