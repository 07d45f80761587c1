import pytest

from ledger import Account, AccountClosed, InsufficientFunds, Money


def test_deposit_and_withdraw():
    acc = Account("A1", "ana")
    acc.deposit(Money(100))
    acc.withdraw(Money(30))
    assert acc.balance == Money(70)


def test_insufficient_funds():
    acc = Account("A1", "ana")
    acc.deposit(Money(100))
    with pytest.raises(InsufficientFunds):
        acc.withdraw(Money(200))
    assert acc.balance == Money(100)


def test_overdraft_allows_negative_balance():
    acc = Account("A1", "ana", overdraft_limit=Money(50))
    acc.withdraw(Money(20))
    assert acc.balance == Money(-20)


def test_withdraw_rejects_non_positive():
    with pytest.raises(ValueError):
        Account("A1", "ana").withdraw(Money(0))


def test_closed_account():
    acc = Account("A1", "ana")
    acc.close()
    with pytest.raises(AccountClosed):
        acc.deposit(Money(1))
