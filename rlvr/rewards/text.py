"""Rewards on the plain text of a completion. Each is total on any model output."""

from __future__ import annotations

from rlvr.types import Prompt


def starts_with(completion: str, prompt: Prompt, prefix: str | list[str]) -> float:
    """1.0 when the completion starts with `prefix` (or any of a list of them; leading whitespace
    ignored), else 0.0. A task even a random tiny model can learn by RL alone, for tests.

    >>> p = Prompt(messages=[], answer="")
    >>> starts_with(" 7 is it", p, "7"), starts_with("it is 7", p, "7"), starts_with("9", p, ["7", "9"])
    (1.0, 0.0, 1.0)
    """
    prefixes = prefix if isinstance(prefix, str) else tuple(prefix)
    return float(completion.lstrip().startswith(prefixes))


def digit_fraction(completion: str, prompt: Prompt) -> float:
    """The share of a completion's characters that are digits (0.0 for an empty one).

    A dense signal that varies between any two random completions, for tests.

    >>> p = Prompt(messages=[], answer="")
    >>> digit_fraction("a1b2", p), digit_fraction("", p)
    (0.5, 0.0)
    """
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0
