"""ledger: money, accounts and a transaction log."""
from ledger.account import Account, AccountClosed, InsufficientFunds
from ledger.bank import Bank, Transaction
from ledger.csvio import export_csv, import_csv
from ledger.money import CurrencyMismatch, Money

__all__ = [
    "Account", "AccountClosed", "Bank", "CurrencyMismatch", "InsufficientFunds", "Money",
    "Transaction", "export_csv", "import_csv",
]
__version__ = "2.0.3"
