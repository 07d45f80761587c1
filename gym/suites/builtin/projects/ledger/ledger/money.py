"""Money: a Decimal amount rounded to cents, and a currency code."""
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}


class CurrencyMismatch(ValueError):
    """Two amounts in different currencies were combined."""


@dataclass(frozen=True)
class Money:
    amount: Decimal
    currency: str = "USD"

    def __post_init__(self):
        amount = self.amount
        if not isinstance(amount, Decimal):
            amount = Decimal(amount)
        # Amounts are always whole cents; halves round away from zero, as on a receipt.
        object.__setattr__(self, "amount", amount.quantize(CENT, rounding=ROUND_HALF_UP))

    def _same_currency(self, other):
        if other.currency != self.currency:
            raise CurrencyMismatch(f"cannot combine {self.currency} and {other.currency}")

    def __add__(self, other):
        self._same_currency(other)
        return Money(self.amount + other.amount, self.currency)

    def __sub__(self, other):
        self._same_currency(other)
        return Money(self.amount - other.amount, self.currency)

    def __neg__(self):
        return Money(-self.amount, self.currency)

    def __mul__(self, factor):
        return Money(self.amount * Decimal(str(factor)), self.currency)

    def __lt__(self, other):
        self._same_currency(other)
        return self.amount < other.amount

    def __le__(self, other):
        self._same_currency(other)
        return self.amount <= other.amount

    def is_zero(self):
        return self.amount == 0

    def format(self):
        """Human-readable amount: '$1,234.50'."""
        symbol = SYMBOLS.get(self.currency, self.currency + " ")
        return f"{symbol}{self.amount:,.2f}"

    def __str__(self):
        return self.format()
