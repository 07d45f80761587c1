"""Tasks on the calc project (read by ../build.py; not installed)."""

PROJECT = "calc"

TASKS = [
    dict(
        id="calc-1",
        difficulty="trivial",
        problem_statement="""\
max() returns the smallest argument

```python
>>> calculate("max(3, 7, 5)")
3
```

Expected `7`. `min()` works fine.
""",
        fix={"calc/evaluator.py": [('    "max": min,\n', '    "max": max,\n')]},
        tests={"tests/test_calc.py": '''

def test_max_function():
    assert calculate("max(3, 7, 5)") == 7
    assert calculate("max(2, -1) - min(2, -1)") == 3
'''},
    ),
    dict(
        id="calc-2",
        difficulty="easy",
        problem_statement="""\
Subtraction is evaluated right to left

```python
>>> calculate("10 - 4 - 3")
9.0
>>> calculate("1 - 2 + 3")
-4.0
```

`+` and `-` must be left-associative like in Python: expected `3.0` and `2.0`.
Multiplication and division already behave (`8 / 2 / 2 == 2`).
""",
        fix={"calc/parser.py": [
            ("        left = self.term()\n        if self.at_op(\"+\", \"-\"):\n"
             "            op = self.advance().text\n            return BinOp(op, left, self.expr())\n        return left\n",
             "        left = self.term()\n        while self.at_op(\"+\", \"-\"):\n"
             "            op = self.advance().text\n            left = BinOp(op, left, self.term())\n        return left\n"),
        ]},
        tests={"tests/test_calc.py": '''

@pytest.mark.parametrize("text, value", [("10 - 4 - 3", 3), ("1 - 2 + 3", 2), ("2 - 3 - 4 - 5", -10)])
def test_additive_operators_are_left_associative(text, value):
    assert calculate(text) == value
'''},
    ),
    dict(
        id="calc-3",
        difficulty="easy",
        problem_statement="""\
Numbers like `.5` and `1e3` are rejected

```python
>>> calculate(".5 + .25")
CalcError: unexpected character '.' at column 1
>>> calculate("1e3")
CalcError: unexpected 'e3'
```

Please accept a leading decimal point and an exponent (`1e3`, `2.5e-1`, `1.5E+2`), as
Python does.
""",
        fix={"calc/lexer.py": [("    (?P<NUMBER>\\d+(?:\\.\\d*)?)\n",
                                "    (?P<NUMBER>(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][-+]?\\d+)?)\n")]},
        tests={"tests/test_lexer.py": '''

@pytest.mark.parametrize("text", ["1e3", "2.5e-1", "1.5E+2", ".5"])
def test_number_forms_are_one_token(text):
    assert [t.kind for t in tokenize(text)] == ["NUMBER", "EOF"]
''', "tests/test_calc.py": '''

def test_decimal_and_exponent_numbers():
    assert calculate(".5 + .25") == 0.75
    assert calculate("1e3") == 1000
    assert calculate("2.5e-1 * 4") == 1
'''},
    ),
    dict(
        id="calc-4",
        difficulty="easy",
        problem_statement="""\
Parse errors do not say where the problem is

Lexer errors carry a column (`CalcError.position`) but parser errors don't:

```python
>>> try:
...     calculate("1 + * 2")
... except CalcError as e:
...     print(e, e.position)
unexpected '*' None
```

Expected the 0-based `position` of the offending token (4 here) and the message to end
with `at column 5`, like lexer errors. At the end of input the position is the length
of the text.
""",
        fix={"calc/parser.py": [("    def error(self, message):\n        raise CalcError(message)\n",
                                 "    def error(self, message):\n        token = self.peek()\n"
                                 "        raise CalcError(f\"{message} at column {token.pos + 1}\", token.pos)\n")]},
        tests={"tests/test_calc.py": '''

def test_parse_error_reports_position():
    with pytest.raises(CalcError) as info:
        calculate("1 + * 2")
    assert info.value.position == 4
    assert str(info.value).endswith("at column 5")


def test_missing_parenthesis_reports_end_of_input():
    with pytest.raises(CalcError) as info:
        calculate("(1 + 2")
    assert info.value.position == 6
'''},
    ),
    dict(
        id="calc-5",
        difficulty="hard",
        problem_statement="""\
Support assignments in Calculator sessions

`Calculator` keeps variables between lines, but there is no way to set one from a line:

```python
>>> c = Calculator()
>>> c.run("x = 3")
CalcError: unexpected '='
```

Please support `NAME = expression` lines in `Calculator.run`: evaluate the expression,
store it in `c.variables` and return the value, so that

```python
>>> c.run("x = 3")
3.0
>>> c.run("y = x * 2")
6.0
>>> c.run("x + y")
9.0
```

Plain `calculate()` should keep rejecting assignments with a `CalcError`.
""",
        fix={
            "calc/parser.py": [
                ("@dataclass(frozen=True)\nclass Call:\n",
                 "@dataclass(frozen=True)\nclass Assign:\n    name: str\n    value: object\n\n\n"
                 "@dataclass(frozen=True)\nclass Call:\n"),
                ("    def expr(self):\n",
                 "    def statement(self):\n        \"\"\"NAME '=' expr | expr, up to the end of input.\"\"\"\n"
                 "        following = self.tokens[self.index + 1] if self.index + 1 < len(self.tokens) else None\n"
                 "        if self.peek().kind == \"NAME\" and following is not None and following.kind == \"OP\" "
                 "and following.text == \"=\":\n"
                 "            name = self.advance().text\n            self.advance()\n"
                 "            node = Assign(name, self.expr())\n        else:\n            node = self.expr()\n"
                 "        if self.peek().kind != \"EOF\":\n            self.error(f\"unexpected {self.peek().text!r}\")\n"
                 "        return node\n\n    def expr(self):\n"),
                ("def parse(text):\n",
                 "def parse_statement(text):\n    \"\"\"Parse an expression or an assignment `NAME = expr`.\"\"\"\n"
                 "    return Parser(tokenize(text)).statement()\n\n\ndef parse(text):\n"),
            ],
            "calc/__init__.py": [
                ("from calc.parser import parse\n", "from calc.parser import Assign, parse, parse_statement\n"),
                ("        return calculate(line, self.variables)\n",
                 "        node = parse_statement(line)\n        if isinstance(node, Assign):\n"
                 "            value = evaluate(node.value, self.variables)\n"
                 "            self.variables[node.name] = value\n            return value\n"
                 "        return evaluate(node, self.variables)\n"),
            ],
        },
        tests={"tests/test_calc.py": '''

def test_calculator_assignment():
    calc = Calculator()
    assert calc.run("x = 3") == 3
    assert calc.run("y = x * 2") == 6
    assert calc.run("x + y") == 9
    assert calc.variables == {"x": 3.0, "y": 6.0}


def test_plain_calculate_rejects_assignment():
    with pytest.raises(CalcError):
        calculate("x = 3")
'''},
    ),
    dict(
        id="calc-6",
        difficulty="hard",
        problem_statement="""\
Add the modulo operator `%`

```python
>>> calculate("7 % 3")
CalcError: unexpected character '%' at column 3
```

Please support `%` with the same precedence as `*` and `/` and Python's semantics
(`-7 % 3 == 2`). Modulo by zero must raise `CalcError("division by zero")` like `/`.
""",
        fix={
            "calc/lexer.py": [("  | (?P<OP>\\*\\*|[-+*/=])\n", "  | (?P<OP>\\*\\*|[-+*/%=])\n")],
            "calc/parser.py": [
                ("    term   := unary (('*' | '/') unary)*\n", "    term   := unary (('*' | '/' | '%') unary)*\n"),
                ("        while self.at_op(\"*\", \"/\"):\n", "        while self.at_op(\"*\", \"/\", \"%\"):\n"),
            ],
            "calc/evaluator.py": [
                ('    "/": operator.truediv,\n', '    "/": operator.truediv,\n    "%": operator.mod,\n'),
                ('        if node.op == "/" and right == 0:\n', '        if node.op in ("/", "%") and right == 0:\n'),
            ],
        },
        tests={"tests/test_calc.py": '''

@pytest.mark.parametrize("text, value", [("7 % 3", 1), ("2 + 7 % 4 * 2", 8), ("-7 % 3", 2)])
def test_modulo(text, value):
    assert calculate(text) == value


def test_modulo_by_zero():
    with pytest.raises(CalcError, match="division by zero"):
        calculate("5 % 0")
'''},
    ),
]
