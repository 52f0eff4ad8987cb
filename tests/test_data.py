"""The synthetic tasks: seeded, a held-out split never drawn for training, the curriculum, function picking's variants."""

from __future__ import annotations

import json

import jsonschema
import pytest

from rlvr.data import is_held_out, multiplication
from rlvr.data.function_picking import FUNCTIONS, FunctionPickingTask
from rlvr.data.multiplication import MultiplicationTask, written_out, written_steps
from rlvr.rewards.structured import function_call_match

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
    assert held_out and all(is_held_out(f"{a}*{b}", 0.2) for a, b in held_out)
    trained = {_operands(p) for p in task.sample(500)}
    assert trained and not trained & held_out


def test_the_written_working_is_right_and_its_reward_counts_each_right_line():
    """Every line of `written_out` is true arithmetic ending in the product; `written_steps` gives the
    whole working 1 and loses one line's share for each line with a wrong number."""
    import doctest
    import random

    assert doctest.testmod(multiplication).failed == 0
    rng, task = random.Random(0), _task(levels=[[4, 2]])
    for _ in range(200):
        a, b = rng.randrange(1000, 10000), rng.randrange(10, 100)
        prompt = task._prompt(a, b, 0)
        lines = written_out(a, b).splitlines()
        assert lines[-1] == f"<answer>{a * b}</answer>"
        for line in lines[:-1]:
            x, op, y, _, result = line.split()
            assert (int(x) * int(y) if op == "*" else int(x) + int(y)) == int(result), line  # each step is true
        assert written_steps(written_out(a, b), prompt) == 1.0
        wrong = rng.randrange(len(lines) - 1)
        lines[wrong] = lines[wrong] + "1"
        assert written_steps("\n".join(lines), prompt) == pytest.approx(1 - 1 / (len(lines) - 1))


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


def _picking(**kw) -> FunctionPickingTask:
    return FunctionPickingTask(template="{functions}\n{request}\n{instruction}", eval_size=16, **kw)


@pytest.mark.parametrize("arguments", ["none", "easy", "hard"])
def test_function_picking_lists_the_right_function_and_asks_for_what_the_variant_needs(arguments):
    task = _picking(distractors=4, arguments=arguments, seed=3)
    for p in task.sample(20):
        call = json.loads(p.answer)
        listed = [json.loads(line)["name"] for line in p.messages[0]["content"].splitlines()[:5]]
        assert len(set(listed)) == 5 and call["name"] in listed and listed == p.meta["functions"]
        schema = next(f for f in FUNCTIONS if f.name == call["name"]).schema()["parameters"]
        if arguments == "none":
            assert call == {"name": call["name"]}
        else:
            assert jsonschema.Draft202012Validator(schema).is_valid(call["arguments"])  # a valid call
            if arguments == "easy":
                assert set(call["arguments"]) == set(schema["required"])
                assert all(str(v) in p.meta["request"] for v in call["arguments"].values())  # stated verbatim
        assert function_call_match(f"<answer>{json.dumps(call)}</answer>", p) == 1.0


def test_function_picking_is_seeded_and_its_eval_split_is_held_out():
    a, b, c = _picking(seed=0), _picking(seed=0), _picking(seed=1)
    assert [p.answer + p.meta["request"] for p in a.sample(8)] == [p.answer + p.meta["request"] for p in b.sample(8)]
    assert [p.meta["request"] for p in a.sample(8)] != [p.meta["request"] for p in c.sample(8)]
    held_out = {p.meta["request"] for p in a.eval_prompts()}
    assert held_out == {p.meta["request"] for p in c.eval_prompts()} and len(held_out) == 16
    assert not held_out & {p.meta["request"] for p in a.sample(500)}
    state = a.state_dict()
    nxt = [p.answer for p in a.sample(5)]
    b.load_state_dict(json.loads(json.dumps(state)))
    assert [p.answer for p in b.sample(5)] == nxt


@pytest.mark.parametrize("kwargs, message", [
    ({"distractors": 15}, "data.distractors must be in"),
    ({"arguments": "medium"}, "data.arguments must be one of"),
    ({"template": "{request}"}, "data.template must contain {functions}"),
])
def test_function_picking_rejects_bad_knobs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FunctionPickingTask(**{"template": "{functions} {request}", **kwargs})
