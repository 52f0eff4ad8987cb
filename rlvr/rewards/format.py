"""Rewards for the shape of a completion (reasoning in <think>, the result in <answer>). Total on any output."""

from __future__ import annotations

import re

from rlvr.types import Prompt

_STRICT = re.compile(r"\s*<think>(?:(?!</?think>).)+</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)


def think_answer_format(completion: str, prompt: Prompt) -> float:
    """1.0 for exactly "<think>…</think><answer>…</answer>" (both non-empty, nothing around them but
    space); 0.5 when both blocks appear but not in that clean shape; 0.0 otherwise.

    >>> p = Prompt(messages=[], answer="")
    >>> think_answer_format("<think>6*7</think> <answer>42</answer>", p)
    1.0
    >>> think_answer_format("I think <answer>42</answer> <think>hm</think>", p), think_answer_format("<think>x", p)
    (0.5, 0.0)
    """
    if _STRICT.fullmatch(completion):
        return 1.0
    return 0.5 if _THINK.search(completion) and _ANSWER.search(completion) else 0.0
