"""The multiplication task: seeded, held-out split never drawn for training, curriculum."""

from __future__ import annotations

import json

import pytest

from rlvr.data.multiplication import MultiplicationTask, is_held_out

TEMPLATE = "What is {a} * {b}?"


def _task(**kw) -> MultiplicationTask:
    return MultiplicationTask(levels=kw.pop("levels", [[2, 1], [2, 2]]), template=TEMPLATE, **kw)


def _operands(prompt):
    a, b = prompt.messages[-1]["content"].removeprefix("What is ").removesuffix("?").split(" * ")
    return int(a), int(b)


def test_same_seed_same_prompts_and_answers_are_products():
    first, second = _task(seed=3).sample(20), _task(seed=3).sample(20)
    assert [p.messages for p in first] == [p.messages for p in second]
    for p in first:
        a, b = _operands(p)
        assert 10 <= a <= 99 and 1 <= b <= 9 and p.answer == str(a * b)


def test_training_never_draws_a_held_out_problem():
    task = _task(levels=[[1, 1]], eval_fraction=0.2)
    held_out = {_operands(p) for p in task.eval_prompts()}
    assert held_out and all(is_held_out(a, b, 0.2) for a, b in held_out)
    trained = {_operands(p) for p in task.sample(500)}
    assert trained and not trained & held_out


def test_eval_set_is_fixed_and_spread_over_levels():
    a, b = _task(seed=0, eval_size=10), _task(seed=1, eval_size=10)
    assert [p.messages for p in a.eval_prompts()] == [p.messages for p in b.eval_prompts()]
    assert [p.meta["level"] for p in a.eval_prompts()] == ["2x1"] * 5 + ["2x2"] * 5


def test_curriculum_advances_after_a_window_of_high_accuracy():
    task = _task(advance_at=0.8, window=2)
    for accuracy, level in [(0.9, 0),   # one step is not a window
                            (0.5, 0),   # mean 0.7 < 0.8
                            (0.9, 0),   # mean 0.7 over [0.5, 0.9]
                            (0.9, 1),   # mean 0.9: up to 2x2, history cleared
                            (1.0, 1),   # one step at the new level is not a window
                            (1.0, 1)]:  # already at the last level
        task.update(accuracy)
        assert task.level == level
    assert task.metrics()["curriculum/level"] == 1.0
    assert all(p.meta["level"] == "2x2" for p in task.sample(5))


@pytest.mark.parametrize("kw, message", [
    ({"levels": []}, "data.levels"),
    ({"levels": [[0, 1]]}, "data.levels"),
    ({"eval_fraction": 1.5}, "data.eval_fraction"),
])
def test_bad_settings_name_the_key(kw, message):
    with pytest.raises(ValueError, match=message):
        _task(**kw)


def test_state_dict_round_trip_continues_the_same_prompts():
    task = _task(seed=5, advance_at=0.5, window=1)
    task.sample(7)
    task.update(0.9)  # up to 2x2
    state = json.loads(json.dumps(task.state_dict()))  # as a checkpoint stores it
    expected = [p.messages for p in task.sample(5)]
    other = _task(seed=99)
    other.load_state_dict(state)
    assert other.level == 1 and [p.messages for p in other.sample(5)] == expected
