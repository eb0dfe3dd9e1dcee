"""Stage conditions: a tiny, safe expression language over a quantum's fields.

    "'security' in labels"          "kind != 'chore' and priority <= 2"
    "not ('docs' in labels)"        "complexity in ['standard', 'complex']"

Names: labels, kind, complexity, priority, title. Operators: == != < <= > >= in, not in,
and, or, not. Literals: strings, integers, booleans, lists of them. Nothing else parses, so a
condition can never call code.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

CONDITION_NAMES = frozenset({"labels", "kind", "complexity", "priority", "title"})

_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class BadCondition(ValueError):
    """The condition is not in the condition language; the message says what is wrong."""


def _check(node: ast.AST) -> None:
    if isinstance(node, ast.Expression):
        _check(node.body)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, ast.Not):
            raise BadCondition("only `not` may prefix an expression")
        _check(node.operand)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise BadCondition(f"operator {type(op).__name__} is not allowed")
        _check(node.left)
        for comparator in node.comparators:
            _check(comparator)
    elif isinstance(node, ast.Name):
        if node.id not in CONDITION_NAMES:
            names = ", ".join(sorted(CONDITION_NAMES))
            raise BadCondition(f"unknown name {node.id!r} (known: {names})")
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, str | int | bool):
            raise BadCondition(f"literal {node.value!r} is not a string, integer or boolean")
    elif isinstance(node, ast.List | ast.Tuple):
        for element in node.elts:
            if not isinstance(element, ast.Constant):
                raise BadCondition("a list may hold only literals")
            _check(element)
    else:
        raise BadCondition(f"{type(node).__name__} is not allowed in a condition")


def condition_parse(text: str) -> ast.Expression:
    """Parse and check a condition, or raise BadCondition."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise BadCondition(f"syntax error: {exc.msg}") from None
    _check(tree)
    return tree


def _eval(node: ast.AST, names: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body, names)
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, names) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        return not _eval(node.operand, names)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, names)
            if not _COMPARE[type(op)](left, right):  # type: ignore[no-untyped-call]
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, names) for e in node.elts]
    raise BadCondition(f"{type(node).__name__} is not allowed in a condition")


def condition_holds(text: str, names: Mapping[str, Any]) -> bool:
    """True when the condition is blank or evaluates true against `names`."""
    if not text.strip():
        return True
    try:
        return bool(_eval(condition_parse(text), names))
    except TypeError as exc:
        raise BadCondition(f"cannot evaluate {text!r}: {exc}") from None
