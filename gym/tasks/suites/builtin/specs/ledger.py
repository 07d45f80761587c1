"""Tasks on the ledger project (read by ../build.py; not installed)."""

PROJECT = "ledger"

TASKS = [
    dict(
        id="ledger-1",
        difficulty="trivial",
        problem_statement="""\
Cannot withdraw the whole balance

```python
>>> acc = Account("A1", "ana")
>>> acc.deposit(Money(100))
>>> acc.withdraw(Money(100))
InsufficientFunds: account A1: balance $100.00 cannot cover $100.00
```

The docstring of `withdraw` says the balance may *reach* minus the overdraft limit. With
no overdraft the balance should be able to go to exactly zero, and with a $50 overdraft
to exactly -$50.
""",
        fix={"ledger/account.py": [("        if (self.balance - amount).amount <= -self.overdraft_limit.amount:\n",
                                    "        if (self.balance - amount).amount < -self.overdraft_limit.amount:\n")]},
        tests={"tests/test_account.py": '''

def test_withdraw_entire_balance():
    acc = Account("A1", "ana")
    acc.deposit(Money(100))
    acc.withdraw(Money(100))
    assert acc.balance == Money(0)


def test_withdraw_down_to_the_overdraft_limit():
    acc = Account("A1", "ana", overdraft_limit=Money(50))
    acc.withdraw(Money(50))
    assert acc.balance == Money(-50)
    with pytest.raises(InsufficientFunds):
        acc.withdraw(Money("0.01"))
'''},
    ),
    dict(
        id="ledger-2",
        difficulty="easy",
        problem_statement="""\
Negative amounts are formatted as `$-5.00`

```python
>>> Money("-5").format()
'$-5.00'
```

Statements should show `-$5.00` (sign before the currency symbol), e.g.
`Money("-1234.5", "EUR").format() == "-€1,234.50"`.
""",
        fix={"ledger/money.py": [
            ("        symbol = SYMBOLS.get(self.currency, self.currency + \" \")\n"
             "        return f\"{symbol}{self.amount:,.2f}\"\n",
             "        symbol = SYMBOLS.get(self.currency, self.currency + \" \")\n"
             "        sign = \"-\" if self.amount < 0 else \"\"\n"
             "        return f\"{sign}{symbol}{abs(self.amount):,.2f}\"\n"),
        ]},
        tests={"tests/test_money.py": '''

def test_format_negative_amounts():
    assert Money("-5").format() == "-$5.00"
    assert Money("-1234.5", "EUR").format() == "-€1,234.50"
    assert str(Money(-2)) == "-$2.00"
'''},
    ),
    dict(
        id="ledger-3",
        difficulty="easy",
        problem_statement="""\
Deposits of zero or negative amounts are accepted

`withdraw()` rejects non-positive amounts, but `deposit()` happily takes them, which
lets a negative "deposit" bypass the overdraft check:

```python
>>> acc = Account("A1", "ana")
>>> acc.deposit(Money(-500))
>>> acc.balance
Money(amount=Decimal('-500.00'), currency='USD')
```

`deposit()` should raise `ValueError` for amounts that are not positive, and
`Bank.deposit` must then not record a transaction.
""",
        fix={"ledger/account.py": [
            ("    def deposit(self, amount):\n        self._check_open()\n",
             "    def deposit(self, amount):\n        self._check_open()\n"
             "        if amount.amount <= 0:\n            raise ValueError(\"deposit amount must be positive\")\n"),
        ]},
        tests={"tests/test_account.py": '''

@pytest.mark.parametrize("amount", ["0", "-500"])
def test_deposit_rejects_non_positive(amount):
    acc = Account("A1", "ana")
    with pytest.raises(ValueError):
        acc.deposit(Money(amount))
    assert acc.balance == Money(0)
''', "tests/test_bank.py": '''

def test_rejected_deposit_not_recorded(bank):
    with pytest.raises(ValueError):
        bank.deposit("A", Money(-1))
    assert len(bank.transactions) == 1
'''},
    ),
    dict(
        id="ledger-4",
        difficulty="medium",
        problem_statement="""\
A failed transfer still debits the source account

`Bank.transfer` promises that both accounts change or neither does, but when the
deposit into the target fails the money is gone from the source:

```python
>>> bank.account("B").close()
>>> bank.transfer("A", "B", Money(40))
AccountClosed: account B is closed
>>> bank.balance("A")      # was $100.00
Money(amount=Decimal('60.00'), currency='USD')
```

Same with a target account in another currency (`CurrencyMismatch`). After a failed
transfer both balances and the transaction log must be unchanged.
""",
        fix={"ledger/bank.py": [
            ("        src.withdraw(amount)\n        dst.deposit(amount)\n",
             "        src.withdraw(amount)\n        try:\n            dst.deposit(amount)\n"
             "        except Exception:\n"
             "            src.balance = src.balance + amount  # undo: a transfer never half-happens\n"
             "            raise\n"),
        ]},
        tests={"tests/test_bank.py": '''

def test_transfer_to_closed_account_changes_nothing(bank):
    from ledger import AccountClosed

    bank.account("B").close()
    with pytest.raises(AccountClosed):
        bank.transfer("A", "B", Money(40))
    assert bank.balance("A") == Money(100)
    assert len(bank.transactions) == 1


def test_transfer_across_currencies_changes_nothing(bank):
    from ledger import CurrencyMismatch

    bank.open_account("E", "eve", currency="EUR")
    with pytest.raises(CurrencyMismatch):
        bank.transfer("A", "E", Money(10))
    assert bank.balance("A") == Money(100)
    assert bank.balance("E") == Money(0, "EUR")
'''},
    ),
    dict(
        id="ledger-5",
        difficulty="medium",
        problem_statement="""\
Money built from a float rounds the wrong way

```python
>>> Money(2.675).amount
Decimal('2.67')
>>> Money(1.005) == Money("1.01")
False
```

Amounts are documented to round half away from zero, and `Money("2.675")` does give
`2.68`; only floats are off, because the float's binary value (2.67499999...) is used
instead of the number the caller wrote.
""",
        fix={"ledger/money.py": [
            ("        if not isinstance(amount, Decimal):\n            amount = Decimal(amount)\n",
             "        if isinstance(amount, float):\n"
             "            # Decimal(2.675) is 2.67499...; the float's shortest repr is what was meant.\n"
             "            amount = Decimal(repr(amount))\n"
             "        elif not isinstance(amount, Decimal):\n            amount = Decimal(amount)\n"),
        ]},
        tests={"tests/test_money.py": '''

def test_float_amounts_round_like_their_text():
    assert Money(2.675).amount == Decimal("2.68")
    assert Money(1.005) == Money("1.01")
    assert Money(0.1) + Money(0.2) == Money("0.30")
'''},
    ),
    dict(
        id="ledger-6",
        difficulty="hard",
        problem_statement="""\
Importing the bank's web CSV export fails on formatted amounts

The online banking export writes amounts the way they are displayed:

```
id,kind,account,amount,currency,counterparty,memo
1,deposit,A,"$1,234.50",USD,,salary
2,withdrawal,A,-$5.00,,,fee
```

`import_csv` crashes on it with `decimal.InvalidOperation`. Please add a
`Money.parse(text, currency=None)` classmethod that understands plain numbers, thousands
separators, a leading minus, currency symbols (`$`, `€`, `£`) and ISO code prefixes
(`CHF 3.00`), taking the currency from the text when it names one, else from the
`currency` argument (default USD); unparseable text raises `ValueError`. Then use it in
`import_csv` so such files load.
""",
        fix={
            "ledger/money.py": [
                ("from decimal import ROUND_HALF_UP, Decimal\n",
                 "from decimal import ROUND_HALF_UP, Decimal, InvalidOperation\n"),
                ("    def _same_currency(self, other):\n",
                 "    @classmethod\n    def parse(cls, text, currency=None):\n"
                 "        \"\"\"'1234.50', '$1,234.50', '-€3.00' or 'CHF 3.00' -> Money.\"\"\"\n"
                 "        original, text = text, text.strip()\n"
                 "        negative = text.startswith(\"-\")\n        text = text.lstrip(\"-\").strip()\n"
                 "        found = None\n        for code, symbol in SYMBOLS.items():\n"
                 "            if text.startswith(symbol):\n                found, text = code, text[len(symbol):]\n"
                 "                break\n        else:\n            head, _, rest = text.partition(\" \")\n"
                 "            if rest and head.isalpha():\n                found, text = head.upper(), rest\n"
                 "        if found and currency and found != currency:\n"
                 "            raise CurrencyMismatch(f\"{original!r} is in {found}, expected {currency}\")\n"
                 "        try:\n            amount = Decimal(text.replace(\",\", \"\").strip())\n"
                 "        except InvalidOperation:\n            raise ValueError(f\"not an amount: {original!r}\") from None\n"
                 "        return cls(-amount if negative else amount, found or currency or \"USD\")\n\n"
                 "    def _same_currency(self, other):\n"),
            ],
            "ledger/csvio.py": [
                ("from decimal import Decimal\n\n", ""),
                ("        amount = Money(Decimal(row[\"amount\"]), row.get(\"currency\") or \"USD\")\n",
                 "        amount = Money.parse(row[\"amount\"], row.get(\"currency\") or None)\n"),
            ],
        },
        tests={"tests/test_money.py": '''

def test_parse_formatted_amounts():
    assert Money.parse("$1,234.50") == Money("1234.50")
    assert Money.parse("-$5.00") == Money("-5")
    assert Money.parse("€3.10") == Money("3.10", "EUR")
    assert Money.parse("CHF 3.00") == Money("3", "CHF")
    assert Money.parse("12.5", "GBP") == Money("12.50", "GBP")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        Money.parse("twelve")
''', "tests/test_bank.py": '''

def test_import_web_export_with_formatted_amounts():
    text = ('id,kind,account,amount,currency,counterparty,memo\\n'
            '1,deposit,A,"$1,234.50",USD,,salary\\n'
            '2,withdrawal,A,-$5.00,,,fee\\n')
    txs = import_csv(text)
    assert [tx.amount for tx in txs] == [Money("1234.50"), Money("-5.00")]
    assert txs[0].memo == "salary"
'''},
    ),
]
