"""Evaluate a parsed expression."""
import math
import operator

from calc.errors import CalcError
from calc.parser import BinOp, Call, Neg, Num, Var

FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": min,
    "sqrt": math.sqrt,
    "round": round,
    "log": math.log,
}
CONSTANTS = {"pi": math.pi, "e": math.e}
_BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
}


def evaluate(node, variables):
    """Value of `node`; names are looked up in `variables`, then in CONSTANTS."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        if node.name in variables:
            return variables[node.name]
        if node.name in CONSTANTS:
            return CONSTANTS[node.name]
        raise CalcError(f"unknown variable {node.name!r}")
    if isinstance(node, Neg):
        return -evaluate(node.operand, variables)
    if isinstance(node, BinOp):
        left = evaluate(node.left, variables)
        right = evaluate(node.right, variables)
        if node.op == "/" and right == 0:
            raise CalcError("division by zero")
        return _BINARY[node.op](left, right)
    if isinstance(node, Call):
        function = FUNCTIONS.get(node.name)
        if function is None:
            raise CalcError(f"unknown function {node.name!r}")
        args = [evaluate(arg, variables) for arg in node.args]
        try:
            return function(*args)
        except (TypeError, ValueError) as e:
            raise CalcError(f"{node.name}(): {e}") from None
    raise CalcError(f"cannot evaluate {node!r}")
