"""Recursive-descent parser. Grammar, loosest binding first:

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('-' | '+') unary | power
    power  := atom ('**' unary)?          # right-associative, binds tighter than unary minus
    atom   := NUMBER | NAME | NAME '(' [expr (',' expr)*] ')' | '(' expr ')'
"""
from dataclasses import dataclass

from calc.errors import CalcError
from calc.lexer import tokenize


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Neg:
    operand: object


@dataclass(frozen=True)
class BinOp:
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple


class Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.index = 0

    def peek(self):
        return self.tokens[self.index]

    def advance(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at_op(self, *ops):
        token = self.peek()
        return token.kind == "OP" and token.text in ops

    def error(self, message):
        raise CalcError(message)

    def expect(self, kind):
        token = self.peek()
        if token.kind != kind:
            self.error(f"expected {kind.lower()}, found {token.text or 'end of input'!r}")
        return self.advance()

    def parse(self):
        node = self.expr()
        if self.peek().kind != "EOF":
            self.error(f"unexpected {self.peek().text!r}")
        return node

    def expr(self):
        left = self.term()
        if self.at_op("+", "-"):
            op = self.advance().text
            return BinOp(op, left, self.expr())
        return left

    def term(self):
        left = self.unary()
        while self.at_op("*", "/"):
            op = self.advance().text
            left = BinOp(op, left, self.unary())
        return left

    def unary(self):
        if self.at_op("-", "+"):
            op = self.advance().text
            operand = self.unary()
            return Neg(operand) if op == "-" else operand
        return self.power()

    def power(self):
        base = self.atom()
        if self.at_op("**"):
            self.advance()
            return BinOp("**", base, self.unary())
        return base

    def atom(self):
        token = self.peek()
        if token.kind == "NUMBER":
            self.advance()
            return Num(float(token.text))
        if token.kind == "NAME":
            self.advance()
            if self.peek().kind == "LPAREN":
                return Call(token.text, self.arguments())
            return Var(token.text)
        if token.kind == "LPAREN":
            self.advance()
            node = self.expr()
            self.expect("RPAREN")
            return node
        self.error(f"unexpected {token.text or 'end of input'!r}")

    def arguments(self):
        self.expect("LPAREN")
        args = []
        if self.peek().kind != "RPAREN":
            args.append(self.expr())
            while self.peek().kind == "COMMA":
                self.advance()
                args.append(self.expr())
        self.expect("RPAREN")
        return tuple(args)


def parse(text):
    """Parse an expression string into an AST."""
    return Parser(tokenize(text)).parse()
