"""Rewards for structured answers: JSON validity, a JSON schema, a function call.

The JSON is read from the last <answer>…</answer> when there is one, else from the whole
completion; a ```json fence around it is allowed. Every reward is total on any model output.
"""

from __future__ import annotations

import json
import math
import re

from rlvr.records import Prompt
from rlvr.rewards.tags import answer_tag

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


_INVALID = object()


def _load(completion: str):
    text = answer_tag(completion)
    text = (completion if text is None else text).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: "[[[[…" nested beyond the parser's depth
        return _INVALID


def json_payload(completion: str):
    """The JSON value in a completion (see the module docstring), or None when it does not parse.

    >>> json_payload('<answer>{"a": 1}</answer>'), json_payload('```json\\n[1, 2]\\n```'), json_payload("{oops")
    ({'a': 1}, [1, 2], None)
    """
    payload = _load(completion)
    return None if payload is _INVALID else payload


def json_valid(completion: str, prompt: Prompt) -> float:
    """1.0 when the answer is valid JSON, else 0.0.

    >>> p = Prompt(messages=[], answer="")
    >>> json_valid('<answer>{"a": [1, 2]}</answer>', p), json_valid('{"a": 1,}', p), json_valid("", p)
    (1.0, 0.0, 0.0)
    """
    return float(_load(completion) is not _INVALID)


def json_schema_match(completion: str, prompt: Prompt, schema: dict | None = None) -> float:
    """1.0 when the answer is JSON that validates against `schema` (or, when none is given, the
    JSON schema in `prompt.meta["schema"]`), else 0.0.

    >>> p = Prompt(messages=[], answer="", meta={"schema": {"type": "object", "required": ["n"],
    ...            "properties": {"n": {"type": "integer"}}}})
    >>> json_schema_match('{"n": 3}', p), json_schema_match('{"n": "3"}', p), json_schema_match("3", p)
    (1.0, 0.0, 0.0)
    """
    import jsonschema

    payload = _load(completion)
    if payload is _INVALID:
        return 0.0
    schema = schema if schema is not None else prompt.meta.get("schema")
    if schema is None:
        raise ValueError("json_schema_match needs a schema: set its kwargs.schema, or give the data a 'schema' column")
    return float(jsonschema.Draft202012Validator(schema).is_valid(payload))


def parse_call(text: str) -> dict | None:
    """A function call from an answer: a JSON object with a string "name" (and "arguments" as an
    object or a JSON string of one), or a bare function name ("get_weather", "`get_weather()`").

    >>> parse_call('{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}'), parse_call("`get_time()`"), parse_call("hi there")
    ({'name': 'f', 'arguments': {'x': 1}}, {'name': 'get_time'}, None)
    """
    payload = json_payload(text)
    if isinstance(payload, dict) and isinstance(payload.get("name"), str):
        call = {"name": payload["name"].strip()}
        args = payload.get("arguments", payload.get("parameters"))
        if isinstance(args, str):
            args = json_payload(args)
        if args is not None:
            call["arguments"] = args
        return call
    name = text.strip().strip("`'\"").removesuffix("()")
    return {"name": name} if _IDENTIFIER.fullmatch(name) else None


def same_value(a, b) -> bool:
    """JSON values equal up to number type (2 == 2.0), string case and surrounding space; objects
    compared key by key in any order.

    >>> same_value({"a": 2, "b": " Paris"}, {"b": "paris", "a": 2.0}), same_value([1, 2], [2, 1]), same_value(True, 1)
    (True, False, False)
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def arguments_match(got, want: dict, partial: bool = True) -> float:
    """How well predicted arguments match the expected ones (key order never matters). With `partial`,
    the share of keys (expected or predicted) whose values agree, so a missing or an extra argument
    each cost one share; without it, 1.0 only for a full match.

    >>> want = {"city": "Paris", "unit": "celsius"}
    >>> arguments_match({"unit": "celsius", "city": "paris"}, want), arguments_match({"city": "Paris"}, want)
    (1.0, 0.5)
    >>> arguments_match({"city": "Paris"}, want, partial=False), arguments_match("Paris", want)
    (0.0, 0.0)
    """
    if not isinstance(got, dict):
        return 0.0
    if not want and not got:
        return 1.0
    keys = want.keys() | got.keys()
    agree = sum(k in want and k in got and same_value(got[k], want[k]) for k in keys)
    return agree / len(keys) if partial else float(agree == len(keys))


def answered_call(completion: str, prompt: Prompt, fallback_mentioned: bool = False) -> dict | None:
    """The call a completion answers with: `parse_call` of its last <answer>…</answer>. Without tags,
    and with `fallback_mentioned`, the first of the prompt's listed functions (`prompt.meta["functions"]`)
    that the completion names, the way a number-answer reward may fall back to the last number.

    >>> p = Prompt(messages=[], answer="", meta={"functions": ["get_news", "set_timer"]})
    >>> answered_call("I would call set_timer here.", p, fallback_mentioned=True), answered_call("set_timer", p)
    ({'name': 'set_timer'}, None)
    """
    found = answer_tag(completion)
    if found is not None:
        return parse_call(found)
    if fallback_mentioned:
        mentioned = [(at, name) for name in prompt.meta.get("functions", []) if (at := completion.find(name)) >= 0]
        if mentioned:
            return {"name": min(mentioned)[1]}
    return None


def function_name(completion: str, prompt: Prompt, fallback_mentioned: bool = False) -> float:
    """1.0 when the answer calls the expected function (`prompt.answer` is the expected call as JSON,
    `{"name": …, "arguments": {…}}`), whatever its arguments; else 0.0.

    >>> p = Prompt(messages=[], answer='{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    >>> function_name("<answer>get_weather</answer>", p), function_name("<answer>set_timer</answer>", p)
    (1.0, 0.0)
    """
    call = answered_call(completion, prompt, fallback_mentioned)
    return float(call is not None and call["name"] == json.loads(prompt.answer)["name"])


def function_call_match(completion: str, prompt: Prompt, partial: bool = True, fallback_mentioned: bool = False) -> float:
    """The function call in the answer (see `answered_call`) against the expected one: 0.0 for the
    wrong function; for the right one, 1.0 when no arguments are expected, else `arguments_match`.

    >>> p = Prompt(messages=[], answer='{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}')
    >>> function_call_match('<answer>{"name": "get_weather", "arguments": {"unit": "celsius", "city": "Oslo"}}</answer>', p)
    1.0
    >>> function_call_match('<answer>{"name": "get_weather", "arguments": {"city": "Oslo"}}</answer>', p)
    0.5
    >>> function_call_match('<answer>get_weather</answer>', Prompt(messages=[], answer='{"name": "get_weather"}'))
    1.0
    """
    call = answered_call(completion, prompt, fallback_mentioned)
    want = json.loads(prompt.answer)
    if call is None or call["name"] != want["name"]:
        return 0.0
    if "arguments" not in want:
        return 1.0
    return arguments_match(call.get("arguments", {}), want["arguments"], partial)
