"""Rewards on the plain text of a completion. Each is total on any model output."""

from __future__ import annotations

from rlvr.records import Prompt


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


def length_penalty(completion: str, prompt: Prompt, limit: int, span: int | None = None) -> float:
    """0.0 for a completion of at most `limit` characters, falling linearly to -1.0 at `limit + span`
    characters (`span` defaults to `limit`) and staying there. Give it a positive weight; it only
    ever subtracts. (For a penalty in tokens near rollout.max_tokens, see algorithm.overlong.)

    >>> p = Prompt(messages=[], answer="")
    >>> length_penalty("abcd", p, limit=4), length_penalty("abcdef", p, limit=4), length_penalty("x" * 99, p, limit=4)
    (0.0, -0.5, -1.0)
    """
    if limit < 0 or (span is not None and span <= 0):
        raise ValueError(f"length_penalty needs limit >= 0 and span > 0, got limit={limit}, span={span}")
    span = span or max(limit, 1)
    return -min(1.0, (len(completion) - limit) / span) if len(completion) > limit else 0.0
