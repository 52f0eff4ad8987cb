"""Difficulty-aware sampling (rlvr.data.sampling) on a real dataset task: prompts that give a learning
signal are favoured, solved ones retired for a while and then drawn again, the state survives a
checkpoint, and uniform sampling is the task's own order, untouched."""

from __future__ import annotations

import json

import pytest

from rlvr.config import check
from rlvr.data import build_task
from rlvr.data.sampling import DifficultySampling, prompt_key
from rlvr.errors import ConfigError

from .conftest import compose_config
from .test_files import write

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]


def _task(tmp_path, *overrides):
    path = write(tmp_path / "rows.jsonl", ROWS, "jsonl")
    return build_task(compose_config(["data=jsonl", f"data.path={path}", "data.prompt_key=question", "data.eval_size=2",
                                      "data.eval_path=null", *overrides]))


def _number(prompt) -> int:
    return int(prompt.answer) // 2


def test_uniform_sampling_is_the_task_itself(tmp_path):
    task = _task(tmp_path)
    assert not isinstance(task, DifficultySampling) and "sampling" not in task.state_dict()


def test_the_band_that_gives_signal_is_favoured(tmp_path):
    """Prompts whose groups were half right are drawn far more often than ones always right or always
    wrong (weight p(1-p) against the floor), and never-seen prompts as often as the best known ones."""
    task = _task(tmp_path, "data.sampling.mode=difficulty", "data.sampling.retire_steps=0")
    rate = {i: (0.5 if i % 4 == 0 else 1.0 if i % 4 == 1 else 0.0) for i in range(40)}
    for step in range(1, 4):  # every training prompt seen
        prompts = task.task.sample(40)
        task.observe(prompts, [rate[_number(p)] for p in prompts], step)
    drawn = [_number(p) for _ in range(50) for p in task.sample(4)]
    signal = sum(rate[i] == 0.5 for i in drawn) / len(drawn)
    # a quarter of the prompts; uniform would draw them 25% of the time. Each step keeps 4 of 16 offered
    # (about 4 of them in the band), so about 2/3 is what the weights can do.
    assert signal > 0.55


def test_solved_prompts_are_retired_then_drawn_again(tmp_path):
    task = _task(tmp_path, "data.sampling.mode=difficulty", "data.sampling.retire_after=2",
                 "data.sampling.retire_steps=3", "data.sampling.candidates=10")
    everything = task.task.sample(40)
    solved = {prompt_key(p) for p in everything[:20]}
    for step in (1, 2):  # the first 20 solved by their whole group twice in a row: retired until step 5
        task.observe(everything, [1.0 if prompt_key(p) in solved else 0.5 for p in everything], step)
    assert task.metrics()["sampling/retired"] == 20
    for step in (3, 4):
        drawn = task.sample(8)
        assert not {prompt_key(p) for p in drawn} & solved
        task.observe(drawn, [0.5] * len(drawn), step)
    task.observe([], [], 5)  # their time is up
    assert task.metrics()["sampling/retired"] == 0
    assert any(prompt_key(p) in solved for _ in range(20) for p in task.sample(8))


def test_a_resumed_sampler_draws_what_it_would_have(tmp_path):
    # Every part of the state in play: pass rates; prompts solved once (retired when solved again); prompts
    # retired at step 1 (solved in both of its rounds, as dynamic sampling draws them), out until step 3;
    # one prompt too long.
    options = ["data.sampling.mode=difficulty", "data.sampling.retire_after=2", "data.sampling.retire_steps=2"]
    a = _task(tmp_path, *options)
    for step, rounds in ((1, 2), (2, 1)):
        prompts = a.sample(8)
        for _ in range(rounds):
            a.observe(prompts, [(_number(p) % 3) / 2 for p in prompts], step)
    a.dropped(prompts[:1])
    a.metrics()  # (as each step's record does: the candidates passed over counted anew)
    state = json.loads(json.dumps(a.state_dict()))  # as a checkpoint keeps it
    assert state["retired"] and any(state["solved"].values()) and state["too_long"]
    b = _task(tmp_path, *options)
    b.load_state_dict(state)
    assert json.loads(json.dumps(b.state_dict())) == state
    for step in (3, 4, 5):
        drawn = [a.sample(8), b.sample(8)]
        assert [p.answer for p in drawn[0]] == [p.answer for p in drawn[1]]
        for task, prompts in zip((a, b), drawn, strict=True):
            task.observe(prompts, [(_number(p) % 3) / 2 for p in prompts], step)
    assert a.metrics() == b.metrics()


def test_a_prompt_too_long_for_the_context_is_not_drawn_again(tmp_path, tiny_path):
    """Every other prompt is solved (the floor weight) while the long ones stay unseen (the top weight):
    without a memory of the drop, they would fill most of every draw, step after step."""
    from transformers import AutoTokenizer

    from rlvr.prompts import PromptFit

    rows = [{"question": f"What is {i} + {i}?" + (" Think hard." * 40 if i % 4 == 0 else ""), "answer": str(2 * i)}
            for i in range(40)]
    path = write(tmp_path / "rows.jsonl", rows, "jsonl")
    task = build_task(compose_config(["data=jsonl", f"data.path={path}", "data.prompt_key=question", "data.eval_size=2",
                                      "data.eval_path=null", "data.sampling.mode=difficulty",
                                      "data.sampling.retire_steps=0"]))
    fit = PromptFit(AutoTokenizer.from_pretrained(tiny_path), max_model_len=200, max_tokens=16)
    fit.probe(task, 4)
    assert task.metrics()["sampling/passed_over"] == 0  # (the probe's draw was put back, and its count)
    long = {prompt_key(p) for p in task.task.sample(40) if _number(p) % 4 == 0}
    dropped = 0
    for step in range(1, 31):
        prompts, _, too_long = fit.sample(task, 4)
        dropped += too_long
        task.observe(prompts, [1.0] * len(prompts), step)
        assert not long & {prompt_key(p) for p in prompts}
    assert dropped <= len(long) and task.too_long <= long


def test_held_out_prompts_are_never_drawn(tmp_path):
    task = _task(tmp_path, "data.sampling.mode=difficulty")
    held = {p.answer for p in task.eval_prompts()}
    assert held and not held & {p.answer for _ in range(40) for p in task.sample(4)}


@pytest.mark.parametrize("override, message", [
    ("data.sampling.floor=0", "data.sampling.floor: must be in (0, 0.25]"),
    ("data.sampling.candidates=0", "data.sampling.candidates: must be >= 1"),
    ("data.sampling.rate=1.5", "data.sampling.rate: must be in (0, 1]"),
])
def test_bad_sampling_values_are_named(override, message):
    with pytest.raises(ConfigError) as e:
        check(compose_config(["+experiment=multiplication", override]))
    assert message in str(e.value)
