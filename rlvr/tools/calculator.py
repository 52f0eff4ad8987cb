"""A calculator tool: arithmetic on numbers, parsed into a syntax tree and evaluated node by node
(never `eval`): + - * / // % ** and parentheses, with bounds that keep every call cheap."""

from __future__ import annotations

import ast
import operator

MAX_CHARS = 200  # longest expression
MAX_EXPONENT = 64  # largest power
MAX_DIGITS = 100  # largest intermediate integer

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, as text.

    >>> calculator("4721 * 38"), calculator("(2 + 3) / 4"), calculator("2 ** 10 - 1")
    ('179398', '1.25', '1023')
    >>> calculator("__import__('os')")
    Traceback (most recent call last):
    ...
    ValueError: only numbers and + - * / // % ** ( ) are allowed, not Call
    """
    if len(expression) > MAX_CHARS:
        raise ValueError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("×", "*").replace("^", "**"), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents above {MAX_EXPONENT} are not allowed")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
            raise ValueError(f"the result has more than {MAX_DIGITS} digits")
        if isinstance(value, complex):
            raise ValueError("the result is not a real number")
        return value
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")
