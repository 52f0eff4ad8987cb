"""Rewards for tasks with one short final answer (a number, a word, an expression).

Every reward is `reward(completion, prompt, **kwargs) -> float`, total on any model output: it
never raises on what a model writes (empty, huge, unicode, unclosed or nested tags).

Where the answer is read from (`extract`):
- "answer": the last <answer>…</answer> (the innermost one when tags are nested);
- "boxed": the last \\boxed{…} (braces balanced);
- "last_number": the last number (commas as thousands separators allowed);
- "auto": <answer> tags, else \\boxed{}, else the last number;
- "full": the whole completion.
"""

from __future__ import annotations

import math
import re
import string

from rlvr.records import Prompt
from rlvr.rewards.structured import parse_call
from rlvr.rewards.tags import answer_tag

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|-?\.[0-9]+")
EXTRACTORS = ("answer", "boxed", "last_number", "auto", "full")


def boxed(completion: str) -> str | None:
    """The content of the last \\boxed{…} (or \\fbox{…}), braces balanced; None when absent or unclosed.

    >>> boxed(r"so \\boxed{\\frac{1}{2}}."), boxed(r"\\boxed{3} or \\boxed{4}"), boxed(r"\\boxed{2"), boxed("4")
    ('\\\\frac{1}{2}', '4', None, None)
    """
    start = max(completion.rfind("\\boxed{"), completion.rfind("\\fbox{"))
    if start < 0:
        return None
    i = completion.index("{", start) + 1
    depth = 1
    for j in range(i, len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[j], 0)
        if depth == 0:
            return completion[i:j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in `text` as written (ASCII digits; commas as thousands separators).

    >>> last_number("1,234 apples and -5.5 pears"), last_number("1e3"), last_number("no digits") is None
    ('-5.5', '1e3', True)
    """
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


def extract(completion: str, how: str = "auto") -> str | None:
    """The answer part of a completion, read as `how` says (see the module docstring).

    >>> extract("<answer>7</answer>"), extract(r"\\boxed{8}"), extract("so 9."), extract(" x ", "full")
    ('7', '8', '9', 'x')
    >>> extract("no answer", "answer") is None
    True
    """
    if how == "answer":
        return answer_tag(completion)
    if how == "boxed":
        return boxed(completion)
    if how == "last_number":
        return last_number(completion)
    if how == "full":
        return completion.strip()
    if how == "auto":
        for found in (answer_tag(completion), boxed(completion), last_number(completion)):
            if found is not None:
                return found
        return None
    raise ValueError(f"extract must be one of {EXTRACTORS}, got {how!r}")


def normalise(text: str, lowercase: bool = True, strip_punctuation: bool = True) -> str:
    """Text for comparison: whitespace collapsed, optionally lowercased and without ASCII punctuation.

    >>> normalise("  The  Answer: Paris! "), normalise("Paris!", lowercase=False, strip_punctuation=False)
    ('the answer paris', 'Paris!')
    """
    if lowercase:
        text = text.lower()
    if strip_punctuation:
        text = text.translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


def exact_match(completion: str, prompt: Prompt, extract_from: str = "auto", lowercase: bool = True,
                strip_punctuation: bool = True) -> float:
    """1.0 when the extracted answer equals the ground truth after `normalise`, else 0.0.

    >>> p = Prompt(messages=[], answer="Paris")
    >>> exact_match("<answer>paris.</answer>", p), exact_match("<answer>Lyon</answer>", p)
    (1.0, 0.0)
    >>> exact_match("<answer>paris.</answer>", p, lowercase=False), exact_match("", p)
    (0.0, 0.0)
    """
    found = extract(completion, extract_from)
    if found is None:
        return 0.0
    return float(normalise(found, lowercase, strip_punctuation) == normalise(prompt.answer, lowercase,
                                                                             strip_punctuation))


def parse_number(text: str) -> float | None:
    """The last number in `text` as a float ("1,234.5" -> 1234.5; "$12" -> 12; "3/4" -> 0.75); None if none.

    >>> parse_number("$1,234.50"), parse_number("3/4"), parse_number("-2e-3"), parse_number("many")
    (1234.5, 0.75, -0.002, None)
    """
    fraction = re.fullmatch(r"\s*(-?[0-9]+)\s*/\s*([0-9]+)\s*", text)
    if fraction and int(fraction.group(2)) != 0:
        return int(fraction.group(1)) / int(fraction.group(2))
    number = last_number(text)
    if number is None:
        return None
    try:
        value = float(number.replace(",", ""))
    except ValueError:  # e.g. "1,,2" written by a model
        return None
    return value if math.isfinite(value) else None


def numeric_match(completion: str, prompt: Prompt, extract_from: str = "auto", rel_tol: float = 0.0,
                  abs_tol: float = 1e-6) -> float:
    """1.0 when the extracted answer is numerically within tolerance of the ground truth, else 0.0.

    >>> p = Prompt(messages=[], answer="1,000")
    >>> numeric_match("<answer>1000.0</answer>", p), numeric_match("about 1010", p, rel_tol=0.02)
    (1.0, 1.0)
    >>> numeric_match("about 1010", p), numeric_match("<answer>lots</answer>", p)
    (0.0, 0.0)
    """
    found = extract(completion, extract_from)
    want = parse_number(prompt.answer)
    got = parse_number(found) if found is not None else None
    if got is None or want is None:
        return 0.0
    return float(math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol))


def correct(completion: str, prompt: Prompt, fallback_last_number: bool = True) -> float:
    """1.0 when the answer (in <answer> tags, else if allowed the last number) equals the ground
    truth with commas and spaces ignored, else 0.0. The multiplication task's reward.

    >>> p = Prompt(messages=[], answer="1932")
    >>> correct("<answer>1,932</answer>", p), correct("It is 1932.", p), correct("1933", p)
    (1.0, 1.0, 0.0)
    >>> correct("It is 1932.", p, fallback_last_number=False)
    0.0
    """
    found = answer_tag(completion)
    if found is None and fallback_last_number:
        found = last_number(completion)
    if found is None:
        return 0.0
    squash = str.maketrans("", "", ", ")
    return float(found.translate(squash) == prompt.answer.translate(squash))


def _is_call(text: str) -> bool:
    return parse_call(text) is not None


ANSWER_KINDS = {
    "number": lambda s: _NUMBER.fullmatch(s) is not None,
    "any": lambda s: bool(s),
    "call": _is_call,
}


def answer_format(completion: str, prompt: Prompt, kind: str = "number", partial: bool = True) -> float:
    """Credit for the answer-tag format: 1.0 for one <answer>…</answer> holding the right kind of
    content ("number", "call": a function name or a JSON call, "any": anything non-empty).
    With `partial` (so that a model that never writes tags still has a gradient) 0.5 for well-formed
    tags around anything else (or several) and 0.25 for a lone <answer> or </answer>; without it,
    those score 0: credit is gated on a well-formed answer of the right kind.

    >>> p = Prompt(messages=[], answer="6")
    >>> [answer_format(c, p) for c in ["<answer>6</answer>", "<answer>six</answer>", "<answer>6", "6"]]
    [1.0, 0.5, 0.25, 0.0]
    >>> answer_format('<answer>{"name": "f"}</answer>', p, kind="call")
    1.0
    >>> [answer_format(c, p, partial=False) for c in ["<answer>6</answer>", "<answer>6 * 1 = 6</answer>", "<answer>6"]]
    [1.0, 0.0, 0.0]
    """
    found = _ANSWER.findall(completion)
    if len(found) == 1 and ANSWER_KINDS[kind](found[0].strip()):
        return 1.0
    if not partial:
        return 0.0
    if found:
        return 0.5
    if "<answer>" in completion or "</answer>" in completion:
        return 0.25
    return 0.0

_THINK_ANSWER = re.compile(r"\s*<think>(?:(?!</?think>).)+</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def think_answer_format(completion: str, prompt: Prompt) -> float:
    """1.0 for exactly "<think>…</think><answer>…</answer>" (both non-empty, nothing around them but
    space); 0.5 when both blocks appear but not in that clean shape; 0.0 otherwise.

    >>> p = Prompt(messages=[], answer="")
    >>> think_answer_format("<think>6*7</think> <answer>42</answer>", p)
    1.0
    >>> think_answer_format("I think <answer>42</answer> <think>hm</think>", p), think_answer_format("<think>x", p)
    (0.5, 0.0)
    """
    if _THINK_ANSWER.fullmatch(completion):
        return 1.0
    return 0.5 if _THINK.search(completion) and _ANSWER.search(completion) else 0.0
