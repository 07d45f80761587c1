import pytest

from ledger import Bank, InsufficientFunds, Money, export_csv, import_csv


@pytest.fixture
def bank():
    bank = Bank()
    bank.open_account("A", "ana")
    bank.open_account("B", "bo")
    bank.deposit("A", Money(100), memo="salary")
    return bank


def test_transfer_moves_money(bank):
    bank.transfer("A", "B", Money(40), memo="rent")
    assert bank.balance("A") == Money(60)
    assert bank.balance("B") == Money(40)


def test_failed_transfer_changes_nothing(bank):
    with pytest.raises(InsufficientFunds):
        bank.transfer("A", "B", Money(500))
    assert bank.balance("A") == Money(100)
    assert len(bank.transactions) == 1


def test_statement(bank):
    bank.transfer("A", "B", Money(10))
    assert [tx.kind for tx in bank.statement("B")] == ["transfer"]
    assert [tx.kind for tx in bank.statement("A")] == ["deposit", "transfer"]


def test_duplicate_account_rejected(bank):
    with pytest.raises(ValueError):
        bank.open_account("A", "someone")


def test_csv_round_trip(bank):
    bank.transfer("A", "B", Money("12.34"), memo="dinner, drinks")
    assert import_csv(export_csv(bank.transactions)) == bank.transactions
