"""CSV export and import of the transaction log."""
import csv
import io
from decimal import Decimal

from ledger.bank import Transaction
from ledger.money import Money

FIELDS = ["id", "kind", "account", "amount", "currency", "counterparty", "memo"]


def export_csv(transactions):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for tx in transactions:
        writer.writerow({"id": tx.id, "kind": tx.kind, "account": tx.account,
                         "amount": str(tx.amount.amount), "currency": tx.amount.currency,
                         "counterparty": tx.counterparty or "", "memo": tx.memo})
    return out.getvalue()


def import_csv(text):
    transactions = []
    for row in csv.DictReader(io.StringIO(text)):
        amount = Money(Decimal(row["amount"]), row.get("currency") or "USD")
        transactions.append(Transaction(int(row["id"]), row["kind"], row["account"], amount,
                                        row.get("counterparty") or None, row.get("memo") or ""))
    return transactions
