"""Rewards for tasks with a single short answer (a number, a word) in <answer></answer> tags.

Every reward is `reward(completion, prompt, **kwargs) -> float`, total on any model output:
it never raises on what a model writes.
"""

from __future__ import annotations

import re

from rlvr.types import Prompt

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(completion: str, fallback_last_number: bool = False) -> str | None:
    """The content of the last <answer>…</answer>, stripped; else (if asked) the last number.

    >>> extract_answer("so <answer> 42 </answer>")
    '42'
    >>> extract_answer("6 * 7 = 42", fallback_last_number=True)
    '42'
    >>> extract_answer("no answer here") is None
    True
    """
    found = _ANSWER.findall(completion)
    if found:
        return found[-1].strip()
    if fallback_last_number:
        numbers = _NUMBER.findall(completion)
        if numbers:
            return numbers[-1]
    return None


def _normalise_number(text: str) -> str:
    return text.replace(",", "").replace(" ", "").strip()


def correct(completion: str, prompt: Prompt, fallback_last_number: bool = True) -> float:
    """1.0 when the extracted answer equals the ground truth (commas and spaces ignored), else 0.0.

    >>> p = Prompt(messages=[], answer="1932")
    >>> correct("<answer>1,932</answer>", p), correct("It is 1932.", p), correct("1933", p)
    (1.0, 1.0, 0.0)
    >>> correct("It is 1932.", p, fallback_last_number=False)
    0.0
    """
    answer = extract_answer(completion, fallback_last_number)
    if answer is None:
        return 0.0
    return float(_normalise_number(answer) == _normalise_number(prompt.answer))


def answer_format(completion: str, prompt: Prompt) -> float:
    """Partial credit for the answer-tag format, so a model that never writes tags still has a gradient:
    1.0 one <answer>…</answer> holding just a number; 0.5 well-formed tags around anything else
    (or several); 0.25 a lone <answer> or </answer>; 0.0 none.

    >>> p = Prompt(messages=[], answer="6")
    >>> [answer_format(c, p) for c in ["<answer>6</answer>", "<answer>six</answer>", "<answer>6", "6"]]
    [1.0, 0.5, 0.25, 0.0]
    """
    found = _ANSWER.findall(completion)
    if len(found) == 1 and _NUMBER.fullmatch(found[0].strip()):
        return 1.0
    if found:
        return 0.5
    if "<answer>" in completion or "</answer>" in completion:
        return 0.25
    return 0.0
