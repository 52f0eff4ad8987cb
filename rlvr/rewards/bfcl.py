"""The Berkeley Function Calling Leaderboard's AST check of a function call, as a reward.

A completion answers with calls in the rollouts' protocol (`<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, rlvr.tools). It scores 1 when its calls are exactly the expected ones by the
leaderboard's rules (its `ast_checker`, Python categories), else 0:

- as many calls as the ground truth holds (one in the `simple` and `multiple` categories), each the
  expected function;
- every required parameter present, no parameter the function does not have or the ground truth
  does not list, and every listed parameter either given or allowed to be left out (`""` among its
  acceptable values);
- each value of the schema's type (an int is accepted for a float; for an array, its items' type one
  level deep), or of the type of the acceptable values when those differ from the schema's (a
  variable's name written as a string);
- each value among the acceptable ones: strings compared without case, spaces or `,./-_*^`
  (single quotes read as double), lists item by item so, dicts key by key (a key left out only where
  `""` is acceptable), lists of dicts dict by dict in order; other values exactly.

Nothing else counts: a call written in prose, a call that does not parse or a truncated one scores 0.
`why_not` says which rule a call broke (the tests compare it with the leaderboard's own checker).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlvr.tools import all_calls, read_call

# The schema's type names (BFCL's, not JSON Schema's) and the Python type a value must have.
TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                          "tuple": list, "dict": dict, "any": str}
_IGNORED = re.compile(r"[ ,./\-_*^]")


def ast_call(completion: str, prompt) -> float:
    """1.0 when the completion's calls are the expected ones by the leaderboard's AST rules, else 0.0.
    Reads the functions offered (`prompt.meta["functions"]`, BFCL's schemas) and the ground truth
    (`prompt.answer`: BFCL's `ground_truth`, a JSON list of {function: {parameter: [acceptable values]}}).

    >>> from rlvr.records import Prompt
    >>> fn = {"name": "area", "parameters": {"type": "dict", "required": ["base"],
    ...       "properties": {"base": {"type": "float"}, "unit": {"type": "string"}}}}
    >>> p = Prompt([], json.dumps([{"area": {"base": [10.0], "unit": ["cm", ""]}}]), {"functions": [fn]})
    >>> ast_call('<tool_call>{"name": "area", "arguments": {"base": 10}}</tool_call>', p)
    1.0
    >>> ast_call('<tool_call>{"name": "area", "arguments": {"base": 10, "unit": "m"}}</tool_call>', p)
    0.0
    >>> ast_call("I would call area with base 10.", p)
    0.0
    """
    calls, expected = parse_calls(completion), _expected(prompt)
    return float(calls is not None and expected is not None
                 and why_not(calls, prompt.meta.get("functions") or [], expected) is None)


def called_function(completion: str, prompt) -> float:
    """1.0 when the completion's first call (in the protocol) names the expected function, whatever its
    arguments: the function-picking half of `ast_call`.

    >>> from rlvr.records import Prompt
    >>> p = Prompt([], json.dumps([{"area": {"base": [10]}}]))
    >>> called_function('<tool_call>{"name": "area", "arguments": {"base": "ten"}}</tool_call>', p)
    1.0
    """
    calls, expected = parse_calls(completion), _expected(prompt)
    return float(bool(calls) and bool(expected) and calls[0][0] in expected[0])


def _expected(prompt) -> list[dict] | None:
    """The ground truth's calls (`prompt.answer`, BFCL's `ground_truth` as JSON); None if it is not a list."""
    try:
        expected = json.loads(prompt.answer)
    except ValueError:
        return None
    return expected if isinstance(expected, list) else None


def parse_calls(text: str) -> list[tuple[str, dict]] | None:
    """Every `<tool_call>` of `text`, in order, as (name, arguments) (rlvr.tools.read_call, as the rollouts
    read a call); None when any of them does not parse."""
    try:
        return [read_call(body) for body in all_calls(text)]
    except ValueError:
        return None


def why_not(calls: list[tuple[str, dict]], functions: list[dict], expected: list[dict]) -> str | None:
    """None when `calls` are the `expected` ones (in any order) by the module's rules, else the first rule
    broken. `functions`: the BFCL schemas offered; `expected`: [{function: {parameter: [acceptable]}}]."""
    if len(calls) != len(expected):
        return f"{len(calls)} calls, expected {len(expected)}"
    left = list(range(len(calls)))
    for want in expected:
        (name, accepted), = want.items()
        schema = next((f for f in functions if f.get("name") == name), None)
        if schema is None:
            return f"the ground truth's function {name!r} is not among those offered"
        reasons = [_why_not_call(*calls[i], schema, accepted) for i in left]
        if None not in reasons:
            return reasons[0] if len(reasons) == 1 else f"no call matches {name!r}: {reasons}"
        left.pop(reasons.index(None))
    return None


def _why_not_call(name: str, args: dict, schema: dict, accepted: dict[str, list]) -> str | None:
    if name != schema["name"]:
        return f"called {name!r}, expected {schema['name']!r}"
    params = schema.get("parameters") or {}
    properties, required = params.get("properties") or {}, params.get("required") or []
    for param in required:
        if param not in args:
            return f"required argument {param!r} missing"
    for param, value in args.items():
        if param not in properties or param not in accepted:
            return f"unexpected argument {param!r}"
        why = _why_not_value(param, value, properties[param], accepted[param])
        if why is not None:
            return why
    for param, values in accepted.items():
        if param not in args and "" not in values:
            return f"argument {param!r} missing (the ground truth does not allow leaving it out)"
    return None


def _answer_type(values: list) -> type | None:
    """The type of the first acceptable value that is not "" (which marks a parameter as optional)."""
    return next((type(v) for v in values if v != ""), None) if isinstance(values, list) else None


def _why_not_value(param: str, value: Any, schema: dict, acceptable: list) -> str | None:
    kind = schema.get("type")
    want = TYPES.get(kind)
    if want is None:
        return None if value in acceptable else f"{param!r}: {value!r} is not one of {acceptable}"
    items = TYPES.get((schema.get("items") or {}).get("type")) if kind in ("array", "tuple") else None
    if kind == "float" and type(value) is int:
        value = float(value)
    answer_type = _answer_type(acceptable)
    variable = answer_type is not None and answer_type is not want  # e.g. a variable's name for a number
    if type(value) is want:
        if items is not None and not any(not isinstance(a, list) or all(_item_ok(v, items, a) for v in value)
                                         for a in acceptable):
            return f"{param!r}: the items of {value!r} are not of type {kind} of {schema['items']['type']}"
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return f"{param!r} must be of type {kind}, got {type(value).__name__} ({value!r})"
    if not variable:
        if want is dict:
            return None if _dict_ok(value, acceptable) else f"{param!r}: {value!r} is not one of {acceptable}"
        if want is list and items is dict:
            return None if _dicts_ok(value, acceptable) else f"{param!r}: {value!r} is not one of {acceptable}"
        if want is str:
            ok = standardise(value) in [standardise(a) for a in acceptable if isinstance(a, str)]
            return None if ok else f"{param!r}: {value!r} is not one of {acceptable} (compared without case)"
        if want is list:
            ok = _standard(value) in [_standard(a) for a in acceptable if isinstance(a, list | str)]
            return None if ok else f"{param!r}: {value!r} is not one of {acceptable}"
    return None if value in acceptable else f"{param!r}: {value!r} is not one of {acceptable}"


def _item_ok(value: Any, want: type, acceptable: list) -> bool:
    return type(value) is want or type(value) is _answer_type(acceptable)


def standardise(text: str) -> str:
    """A string as the leaderboard compares it: lower case, without spaces or `,./-_*^`, ' as ".

    >>> standardise("April 1, 2024") == standardise("april 1 2024")
    True
    """
    return _IGNORED.sub("", text).lower().replace("'", '"')


def _standard(values) -> list:
    """A list with its strings standardised (an acceptable value of "" is the empty list)."""
    return [standardise(v) if isinstance(v, str) else v for v in values]


def _dict_ok(value: dict, acceptable: list) -> bool:
    """Whether `value` matches one acceptable dict: each key one the ground truth lists, with one of its
    acceptable values; each key left out allowed to be ("" among its values)."""
    for a in acceptable:
        if not isinstance(a, dict):
            continue
        if all(k in a and _standard([v])[0] in _standard(a[k]) for k, v in value.items()) and \
                all(k in value or "" in vs for k, vs in a.items()):
            return True
    return False


def _dicts_ok(value: list, acceptable: list) -> bool:
    """Whether `value` matches one acceptable list of dicts, dict by dict in order."""
    for a in acceptable:
        a = [] if a == "" else a
        if isinstance(a, list) and len(a) == len(value) and all(_dict_ok(v, [w]) for v, w in zip(value, a,
                                                                                                  strict=True)):
            return True
    return False
