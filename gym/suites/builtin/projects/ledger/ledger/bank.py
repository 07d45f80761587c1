"""The bank: accounts by number and an append-only transaction log."""
from dataclasses import dataclass

from ledger.account import Account


@dataclass(frozen=True)
class Transaction:
    id: int
    kind: str
    """'deposit', 'withdrawal' or 'transfer'."""
    account: str
    amount: object
    counterparty: str | None = None
    memo: str = ""


class Bank:
    def __init__(self):
        self.accounts = {}
        self.transactions = []

    def open_account(self, number, owner, currency="USD", overdraft_limit=None):
        if number in self.accounts:
            raise ValueError(f"account {number} already exists")
        account = Account(number, owner, currency, overdraft_limit)
        self.accounts[number] = account
        return account

    def account(self, number):
        try:
            return self.accounts[number]
        except KeyError:
            raise KeyError(f"no account {number}") from None

    def _record(self, kind, number, amount, counterparty=None, memo=""):
        tx = Transaction(len(self.transactions) + 1, kind, number, amount, counterparty, memo)
        self.transactions.append(tx)
        return tx

    def deposit(self, number, amount, memo=""):
        self.account(number).deposit(amount)
        return self._record("deposit", number, amount, memo=memo)

    def withdraw(self, number, amount, memo=""):
        self.account(number).withdraw(amount)
        return self._record("withdrawal", number, amount, memo=memo)

    def transfer(self, source, target, amount, memo=""):
        """Move `amount` from one account to another: both change, or neither does."""
        src, dst = self.account(source), self.account(target)
        src.withdraw(amount)
        dst.deposit(amount)
        return self._record("transfer", source, amount, counterparty=target, memo=memo)

    def statement(self, number):
        """Transactions touching the account, oldest first."""
        return [tx for tx in self.transactions if number in (tx.account, tx.counterparty)]

    def balance(self, number):
        return self.account(number).balance
