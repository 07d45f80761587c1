"""Candidate bugs for a Python source file: AST mutation operators applied as exact text edits.

Contract: `candidates(path, text)` walks every function body of the module (never module or
class level code, decorators, default values or docstrings) and returns one `Mutation` per
operator application, in source order. Each mutation replaces one exact span of the source
(located from the AST node's line/column, UTF-8 columns converted to characters) with new
text, so the diff is minimal and the inverse is exact. `apply(text, mutations)` applies
non-overlapping mutations of one file; every result is checked to still parse.

Operators: `compare` (< <=, > >=, == !=, in / not in, is / is not flipped), `binop`
(+ -, * /, // /, % //, & |, << >>, and augmented assignments), `boolop` (and <-> or),
`constant` (an int off by one, True <-> False), `swap_args` (first two positional call
arguments), `remove_stmt` (a call, assignment, raise, break or continue removed),
`negate` (an if / while / conditional-expression test negated, or its `not` dropped).
"""
from __future__ import annotations

import ast
import gc
import re
import threading
from dataclasses import asdict, dataclass

__all__ = ["Mutation", "candidates", "apply", "parse", "OPERATORS"]

OPERATORS = ("compare", "binop", "boolop", "constant", "swap_args", "remove_stmt", "negate")

_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
        ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_BIN = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
        ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.BitAnd: ("&", "|"),
        ast.BitOr: ("|", "&"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<")}


@dataclass(frozen=True)
class Mutation:
    """One edit: `source[start:end]` (character offsets) was `old`, becomes `new`."""

    file: str
    function: str
    """Qualified name of the innermost enclosing function, e.g. `LRUCache.get`."""
    operator: str
    start: int
    end: int
    old: str
    new: str
    line: int
    """1-based line of the edit's start."""

    def key(self) -> tuple:
        return (self.file, self.start, self.end, self.operator, self.new)

    def as_dict(self) -> dict:
        return asdict(self)


class _Offsets:
    """(lineno, UTF-8 col_offset) -> character offset in the text."""

    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))


def _span(off: _Offsets, node: ast.AST) -> tuple[int, int]:
    return off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)


def _docstring(body: list[ast.stmt]) -> ast.stmt | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


class _Finder:
    def __init__(self, path: str, text: str):
        self.path, self.text, self.off = path, text, _Offsets(text)
        self.out: list[Mutation] = []

    def add(self, function: str, operator: str, start: int, end: int, new: str) -> None:
        old = self.text[start:end]
        if old != new:
            line = self.text.count("\n", 0, start) + 1
            self.out.append(Mutation(self.path, function, operator, start, end, old, new, line))

    def gap_op(self, function: str, operator: str, left: ast.AST, right: ast.AST, op_text: str, new: str) -> None:
        """The operator between two operands: searched in the text between them."""
        a, b = self.off(left.end_lineno, left.end_col_offset), self.off(right.lineno, right.col_offset)
        gap = self.text[a:b]
        pattern = r"\s+".join(re.escape(part) for part in op_text.split())
        if op_text.isalpha() or " " in op_text:
            pattern = r"(?<![\w])" + pattern + r"(?![\w])"
        m = re.search(pattern, gap)
        if m and "#" not in gap[:m.start()]:
            self.add(function, operator, a + m.start(), a + m.end(), new)

    # -- walking ----------------------------------------------------------------------------
    def module(self, tree: ast.Module) -> None:
        self.defs(tree.body, "")

    def defs(self, body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                self.defs(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.function(node, f"{prefix}{node.name}")

    def function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
        doc = _docstring(fn.body)
        stack: list[ast.AST] = [s for s in fn.body if s is not doc]
        self.statements(fn.body, name, doc)
        while stack:
            node = stack.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.function(node, f"{name}.{node.name}")
                continue
            if isinstance(node, ast.ClassDef):
                self.defs(node.body, f"{name}.{node.name}.")
                continue
            self.expression(node, name)
            for child in ast.iter_child_nodes(node):
                stack.append(child)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    self.statements(block, name, None)

    def expression(self, node: ast.AST, fn: str) -> None:
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                old, new = _CMP[type(op)]
                self.gap_op(fn, "compare", left, right, old, new)
                left = right
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            old, new = _BIN[type(node.op)]
            self.gap_op(fn, "binop", node.left, node.right, old, new)
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN:
            old, new = _BIN[type(node.op)]
            self.gap_op(fn, "binop", node.target, node.value, old + "=", new + "=")
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            self.gap_op(fn, "boolop", node.values[0], node.values[1], old, new)
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            s, e = _span(self.off, node)
            self.add(fn, "constant", s, e, str(not node.value))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            s, e = _span(self.off, node)
            if self.text[s:e].isdigit():  # plain decimal literals only
                self.add(fn, "constant", s, e, str(node.value + 1))
                if node.value > 0:
                    self.add(fn, "constant", s, e, str(node.value - 1))
        elif isinstance(node, ast.Call):
            args = [a for a in node.args]
            if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                (s1, e1), (s2, e2) = _span(self.off, args[0]), _span(self.off, args[1])
                a1, a2 = self.text[s1:e1], self.text[s2:e2]
                if a1 != a2:
                    self.add(fn, "swap_args", s1, e2, a2 + self.text[e1:s2] + a1)
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            self.negate(node.test, fn, wrap=isinstance(node, ast.IfExp))

    def negate(self, test: ast.expr, fn: str, wrap: bool) -> None:
        s, e = _span(self.off, test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            a, b = _span(self.off, test.operand)
            inner = self.text[a:b]
            self.add(fn, "negate", s, e, f"({inner})" if wrap else inner)
            return
        seg = self.text[s:e]
        simple = isinstance(test, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        self.add(fn, "negate", s, e, f"not {seg}" if simple else f"not ({seg})")

    def statements(self, body: list[ast.stmt], fn: str, doc: ast.stmt | None) -> None:
        """remove_stmt candidates of one block: whole lines removed, or `pass` if it is alone."""
        live = [s for s in body if s is not doc]
        for stmt in live:
            removable = isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise, ast.Break,
                                          ast.Continue, ast.Delete)) or \
                (isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Call, ast.Await)))
            if not removable:
                continue
            s, e = _span(self.off, stmt)
            line_start = self.off.starts[stmt.lineno - 1]
            line_end = self.off.starts[stmt.end_lineno] if stmt.end_lineno < len(self.off.starts) else len(self.text)
            if self.text[line_start:s].strip() or self.text[e:line_end].strip(" \t\r\n"):
                continue  # shares a line with other code (`a = 1; b = 2`, a trailing comment)
            if len(live) == 1:
                self.add(fn, "remove_stmt", s, e, "pass")
            else:
                self.add(fn, "remove_stmt", line_start, line_end, "")


_PARSE_LOCK = threading.Lock()
_PARSE_TRIES = 5


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, safe beside other threads that parse.

    CPython 3.11 keeps the AST converter's recursion counter in interpreter-wide state, so a
    parse in another thread (3.11's traceback formatting parses a line to place its carets,
    so any thread that logs an exception does) can make this one raise a spurious
    `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905; it failed
    a CI run). The counter is reset when a conversion starts and checked when it ends, so a
    conversion no other thread can interleave with is always balanced: the converter runs no
    Python code but the garbage collector's finalizers, which is where the interpreter may
    switch threads, so the collector is held off for the parse (and our parses share a lock).
    The spurious error is still retried, as a second line of defence."""
    for attempt in range(_PARSE_TRIES):
        try:
            with _PARSE_LOCK:
                collecting = gc.isenabled()
                gc.disable()
                try:
                    return ast.parse(text, filename=filename)
                finally:
                    if collecting:
                        gc.enable()
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == _PARSE_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def candidates(path: str, text: str) -> list[Mutation]:
    """Every mutation of every function body in `text` (the source of `path`), in source
    order; each one leaves a module that still parses."""
    tree = parse(text, filename=path)
    finder = _Finder(path, text)
    finder.module(tree)
    seen: set[tuple] = set()
    out = []
    for m in sorted(finder.out, key=lambda m: (m.start, m.end, m.operator, m.new)):
        if m.key() in seen:
            continue
        seen.add(m.key())
        try:
            parse(apply(text, [m], check=False))
        except SyntaxError:
            continue
        out.append(m)
    return out


def apply(text: str, mutations: list[Mutation], check: bool = True) -> str:
    """`text` with the mutations (all of one file, non-overlapping) applied."""
    ordered = sorted(mutations, key=lambda m: m.start)
    for a, b in zip(ordered, ordered[1:]):
        if b.start < a.end:
            raise ValueError(f"mutations overlap in {a.file}: {a.start}-{a.end} and {b.start}-{b.end}")
    for m in reversed(ordered):
        if text[m.start:m.end] != m.old:
            raise ValueError(f"{m.file}:{m.line}: expected {m.old!r} at {m.start}, found {text[m.start:m.end]!r}")
        text = text[:m.start] + m.new + text[m.end:]
    if check:
        parse(text)
    return text
