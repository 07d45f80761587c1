"""Accounts: a balance that may go down to minus the overdraft limit."""
from dataclasses import dataclass, field

from ledger.money import Money


class InsufficientFunds(Exception):
    """A withdrawal would take the balance below the overdraft limit."""


class AccountClosed(Exception):
    """The account no longer accepts transactions."""


@dataclass
class Account:
    number: str
    owner: str
    currency: str = "USD"
    overdraft_limit: Money = None
    balance: Money = field(init=False)
    closed: bool = False

    def __post_init__(self):
        self.balance = Money(0, self.currency)
        if self.overdraft_limit is None:
            self.overdraft_limit = Money(0, self.currency)

    def _check_open(self):
        if self.closed:
            raise AccountClosed(f"account {self.number} is closed")

    def deposit(self, amount):
        self._check_open()
        self.balance = self.balance + amount

    def withdraw(self, amount):
        """Take `amount` out; the balance may reach, but not pass, -overdraft_limit."""
        self._check_open()
        if amount.amount <= 0:
            raise ValueError("withdrawal amount must be positive")
        if (self.balance - amount).amount <= -self.overdraft_limit.amount:
            raise InsufficientFunds(
                f"account {self.number}: balance {self.balance} cannot cover {amount}")
        self.balance = self.balance - amount

    def close(self):
        if not self.balance.is_zero():
            raise ValueError(f"account {self.number} still holds {self.balance}")
        self.closed = True
