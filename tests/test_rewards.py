"""Reward functions: their doctests, and tables of awkward model outputs (each case says why)."""

from __future__ import annotations

import doctest

import pytest
from omegaconf import OmegaConf

from rlvr.rewards import RewardError, Rewards, answer, text
from rlvr.types import Prompt, Rollout

P = Prompt(messages=[], answer="1932")


@pytest.mark.parametrize("module", [answer, text])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("completion, expected", [
    ("<answer>1932</answer>", 1.0),            # the asked-for format
    ("<answer> 1,932 </answer>", 1.0),         # thousands separator and spaces
    ("84 * 23 = 1932", 1.0),                   # no tags: the last number counts
    ("<answer>1932</answer> wait, 1933", 1.0),  # tags win over a later bare number
    ("<answer>12</answer><answer>1932</answer>", 1.0),  # the last tagged answer counts
    ("<answer>1932", 1.0),                     # unclosed tag: falls back to the last number
    ("", 0.0),                                 # empty
    ("١٩٣٢", 0.0),                             # Arabic-Indic digits are not read as a number
    ("9" * 100_000, 0.0),                      # huge
    ("<answer><answer>1932</answer></answer>", 1.0),  # nested: the innermost answer counts
    ("-1932", 0.0),                            # sign matters
])
def test_correct(completion, expected):
    assert answer.correct(completion, P) == expected


@pytest.mark.parametrize("completion, expected", [
    ("<answer>1932</answer>", 1.0),
    ("<answer>about 1932</answer>", 0.5),   # tags around more than a number
    ("<answer>1</answer><answer>2</answer>", 0.5),  # several answers
    ("</answer>", 0.25),                     # a lone closing tag
    ("1932", 0.0),
    ("", 0.0),
])
def test_answer_format(completion, expected):
    assert answer.answer_format(completion, P) == expected


def _rewards(terms: dict) -> Rewards:
    return Rewards(OmegaConf.create({"terms": terms, "correct_term": "correct"}))


def test_weighted_total_and_a_raising_term_is_counted_not_fatal():
    rewards = _rewards({
        "correct": {"_target_": "rlvr.rewards.answer.correct", "weight": 1.0, "kwargs": {}},
        "format": {"_target_": "rlvr.rewards.answer.answer_format", "weight": 0.5, "kwargs": {}},
        "broken": {"_target_": "builtins.int", "weight": 1.0, "kwargs": {}},  # int(text, prompt) raises
    })
    r = Rollout(prompt=P, group=0, prompt_ids=[], completion_ids=[], sampler_logprobs=[],
                text="<answer>1932</answer>", finish_reason="stop")
    rewards.score([r])
    assert r.rewards == {"correct": 1.0, "format": 1.0, "broken": 0.0}
    assert r.reward == 1.5
    assert rewards.errors == 1


def test_unimportable_reward_names_the_term():
    with pytest.raises(RewardError, match="reward.terms.correct._target_"):
        _rewards({"correct": {"_target_": "rlvr.rewards.nope.missing", "weight": 1.0, "kwargs": {}}})
