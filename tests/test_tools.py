"""Tools and multi-turn rollouts: the calculator, the Python sandbox, tool calls that fail in every
way, and multi-turn rollouts on both engines with a tiny model taught (here, by a few seconds of
supervised training) to call the calculator."""

from __future__ import annotations

import doctest
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

import rlvr.tools
import rlvr.tools.calculator
from rlvr.algorithms.objective import SFT
from rlvr.data.multiplication import MultiplicationTask
from rlvr.learner import make_batch
from rlvr.learner.precision import CANARY_TOL
from rlvr.prompts import render
from rlvr.rollout.multiturn import ToolRollouts, build_tools
from rlvr.tools import ToolBox, ToolConfigError, load_tools, parse_call
from rlvr.tools.calculator import calculator
from rlvr.tools.python import python

from .conftest import cli_here, compose_config, run_cli

CALCULATOR = {"_target_": "rlvr.tools.calculator.calculator", "description": "Evaluate arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                             "required": ["expression"]}}
TOL = CANARY_TOL["float32"]


def test_doctests():
    for module in (rlvr.tools, rlvr.tools.calculator):
        assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("expression, value", [("4721 * 38", "179398"), ("-(3 + 4) * 2", "-14"), ("7 / 2", "3.5"),
                                               ("2 ^ 10", "1024"), ("10 % 4 + 9 // 2", "6"), ("1.5 * 4", "6")])
def test_calculator_computes(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('true')", "not Call"), ("x * 2", "not Name"), ("(1).real", "not Attribute"),
    ("9 ** 9 ** 9", "exponents above"), ("1 / 0", "division by zero"), ("10 ** 60 * 10 ** 60", "more than"),
    ("2 +", "not an arithmetic"), ("1" * 300, "longer than"), ("'a' * 3", "not Constant")])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, why):
    with pytest.raises(ValueError, match=why):
        calculator(expression)


@pytest.mark.parametrize("text, error", [
    ("<tool_call>{not json}</tool_call>", "not JSON"), ('<tool_call>["calculator"]</tool_call>', "JSON object"),
    ('<tool_call>{"name": "c", "arguments": [1]}</tool_call>', "arguments must be"),
    ('{"name": "c"}</tool_call>', "without a <tool_call>")])
def test_malformed_calls_say_what_is_wrong(text, error):
    with pytest.raises(ValueError, match=error):
        parse_call(text)


def test_arguments_written_as_a_json_string_are_read():
    assert parse_call('x <tool_call>{"name": "c", "arguments": "{\\"a\\": 1}"}</tool_call>') == ("c", {"a": 1})


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


def _flood(n: int) -> str:
    return "x" * n


def _fail() -> str:
    raise KeyError("broken tool")


def test_a_call_that_fails_in_any_way_answers_with_an_error_and_is_counted():
    tools = {"calculator": load_tools({"calculator": CALCULATOR})["calculator"]}
    for name, fn, params in [("sleep", _sleep, {"seconds": {"type": "number"}}), ("flood", _flood, {"n": {"type": "integer"}}),
                             ("fail", _fail, {})]:
        tools[name] = rlvr.tools.Tool(name, name, {"type": "object", "properties": params}, fn)
    box = ToolBox(tools, timeout_s=0.5, max_output_chars=50)
    assert box.call("calculator", {"expression": "6 * 7"}) == ("42", None)
    for name, args, shown in [("nope", {}, "no tool named 'nope'"),
                              ("calculator", {"expr": "1"}, "'expression' is a required property"),
                              ("calculator", {"expression": "os"}, "calculator failed: ValueError"),
                              ("sleep", {"seconds": 5}, "timed out after 0.5 s"),
                              ("fail", {}, "KeyError: 'broken tool'")]:
        t0 = time.monotonic()
        text, error = box.call(name, args)
        assert text.startswith("error: ") and shown in text and error, (name, text)
        assert time.monotonic() - t0 < 3
    text, error = box.call("flood", {"n": 10_000})
    assert text.startswith("x" * 50) and "9950 more characters cut" in text and len(text) < 100 and error


@pytest.mark.parametrize("spec, key", [
    ({"description": "d", "parameters": {"type": "object"}}, "tools.t._target_ is missing"),
    ({**CALCULATOR, "_target_": "rlvr.tools.nowhere.calc"}, "tools.t._target_='rlvr.tools.nowhere.calc' cannot be imported"),
    ({**CALCULATOR, "description": ""}, "tools.t.description"),
    ({**CALCULATOR, "parameters": {"type": "objekt"}}, "tools.t.parameters is not a valid JSON schema"),
    ({**CALCULATOR, "parameters": {"type": "string"}}, "needs type: object"),
    ({**CALCULATOR, "timeout": 3}, "tools.t: no such key 'timeout'")])
def test_a_tool_that_cannot_load_fails_naming_its_key(spec, key):
    with pytest.raises(ToolConfigError, match=key.replace("(", r"\(").replace(".", r"\.")):
        load_tools({"t": spec})


def test_python_tool_runs_code_and_returns_its_output():
    assert python("print(6 * 7)") == "42\n"
    out = python("import os, sys; print(sorted(os.environ)); print(os.getcwd()); print(sys.flags.isolated)")
    env, cwd, isolated = out.splitlines()
    assert set(eval(env)) <= {"LC_CTYPE"} and "rlvr-python-" in cwd and isolated == "1"
    assert not Path(cwd).exists()  # the scratch folder is gone


@pytest.mark.parametrize("code, error", [
    ("while True: pass", "ran past 2 s"),
    ("x = bytearray(2 * 10**9)", "MemoryError"),
    ("open('big', 'wb').write(b'x' * 3 * 2**20)", "File too large"),
    ("raise SystemExit(3)", "exit code 3")])
def test_python_tool_is_limited(code, error):
    with pytest.raises(RuntimeError, match=error):
        python(code, timeout_s=2)


def test_python_tool_has_no_network():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    with pytest.raises(RuntimeError, match="OSError|unreachable|disabled"):
        python(code)
    # the same code outside the sandbox does connect: the server is really there
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    time.sleep(0.2)
    assert len(accepted) == 1
    server.close()


# --- multi-turn rollouts on a tiny model taught to call the calculator --------------------------------

TASK = MultiplicationTask(levels=[[2, 2]], template="What is {a} * {b}? Give the final answer in <answer></answer> tags.",
                          system_prompt="You are a careful calculator.")
TAUGHT = [(12, 34), (56, 71), (81, 93)]


def _prompt(a: int, b: int):
    return TASK._prompt(a, b, 0)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory, tiny_path) -> Path:
    """The tiny model after 120 steps of the cold start's own update (`rlvr.sft`: its token ids and
    masks, `Learner.step` with the `SFT` objective) on three conversations in which it calls the calculator and then answers
    with its result."""
    from transformers import AutoTokenizer

    from rlvr.learner import Learner
    from rlvr.sft import Demonstrations

    folder = tmp_path_factory.mktemp("tool_model")
    rows = [{"messages": [*_prompt(a, b).messages,
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"function": {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}}]},
                          {"role": "tool", "content": str(a * b)},
                          {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]} for a, b in TAUGHT]
    (folder / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose_config(["tools=calculator", f"sft.data={folder / 'demos.jsonl'}", "sft.lr=3e-3", "sft.warmup_steps=0"])
    tok = AutoTokenizer.from_pretrained(tiny_path)
    demos = Demonstrations(TASK, cfg, tok, build_tools(cfg.tools, cfg.rollout))  # the calculator of configs/tools/
    torch.manual_seed(0)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 64, "cpu", schedule=cfg.schedule("sft"),
                      shared_prefix=cfg.sft.packing)
    for _ in range(120):
        loss = learner.step(make_batch(demos.next(len(rows)), learner.policy.pad_id), SFT())["loss"]
    assert loss < 0.1
    path = folder / "model"
    learner.policy.save(path)
    return path


class CountingEngine:
    """The real engine, counting its `generate` calls (the turns must be batched)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return self.engine.generate(*args, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_multi_turn_rollouts_train_on_exactly_the_engines_tokens(backend, tool_model, cache_dir):
    from rlvr.learner import Learner
    from rlvr.rollout.engine import build_engine

    cfg = compose_config(["model=local", f"model.path={tool_model}", "tools=calculator", "rollout.temperature=1.0",
                          "rollout.max_tokens=64", f"rollout.backend={backend}"], cache_dir)
    learner = Learner(tool_model, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 64, "cpu")
    box = build_tools(cfg.tools, cfg.rollout)
    engine = CountingEngine(build_engine(tool_model, cfg.rollout, "float32", 0, "cpu", cache_dir))
    turns = ToolRollouts(engine, learner.policy.tokenizer, box, 64, cfg.rollout.max_turns, None, cfg.rollout.max_model_len)
    prompts = [_prompt(a, b) for a, b in TAUGHT[:2]]
    ids = [render(learner.policy.tokenizer, p, box) for p in prompts]
    try:
        rollouts = turns.generate(prompts, ids, n=4, seed=5)
        assert engine.calls <= cfg.rollout.max_turns  # one batched call per turn, not one per conversation
        called = [r for r in rollouts if r.tool_calls and not r.tool_errors]
        assert len(called) >= 2, [r.text for r in rollouts]
        for r in called:
            tool = r.conversation[1]
            assert r.conversation[0]["role"] == "assistant" and tool["role"] == "tool"
            assert tool["content"] == calculator(parse_call(r.conversation[0]["content"])[1]["expression"])
            # the appended tokens: exactly the template's tool turn, masked out, without sampler logprobs
            appended = turns.tool_turn_ids(tool["content"])
            start = r.completion_mask.index(0)
            assert r.completion_mask[start : start + len(appended)] == [0] * len(appended)
            assert r.completion_ids[start : start + len(appended)] == appended
            assert sum(r.completion_mask) == len(r.completion_mask) - len(appended)
            assert all(lp == 0.0 for lp, m in zip(r.sampler_logprobs, r.completion_mask, strict=True) if not m)
            assert tool["content"] in r.text
        # the learner scores every model token as the engine sampled it, across turns
        batch = make_batch(rollouts, learner.policy.pad_id)
        assert batch.loss_mask.sum() == sum(sum(r.completion_mask) for r in rollouts)
        with torch.no_grad():
            scores = learner.scorer.batch_logprobs(batch)
        diff = ((scores - batch.old_logprobs).abs() * batch.loss_mask).max().item()
        assert diff < TOL
        # the same seed repeats every turn
        again = turns.generate(prompts, ids, n=4, seed=5)
        assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]
        # split as ranks split a call (rlvr.distributed.split: prompt 1 alone, seeded 5 + 1 * 4), every
        # turn samples what it samples in the whole call
        halves = turns.generate(prompts[:1], ids[:1], n=4, seed=5) + turns.generate(prompts[1:], ids[1:], n=4, seed=9)
        assert [r.completion_ids for r in halves] == [r.completion_ids for r in rollouts]
        # no turn left to answer the call: it ends there
        one = ToolRollouts(engine, learner.policy.tokenizer, box, 64, 1, None, cfg.rollout.max_model_len)
        for r in one.generate(prompts, ids, n=1, seed=5, greedy=True):
            assert r.tool_calls == 0 and r.finish_reason == "length" and r.conversation[-1]["role"] == "assistant"
        # no token budget left for the result: it ends there too
        short = ToolRollouts(engine, learner.policy.tokenizer, box, 64, 3, 64, cfg.rollout.max_model_len)
        for r in short.generate(prompts, ids, n=1, seed=5, greedy=True):
            assert r.finish_reason == "length" and len(r.completion_ids) <= 64
    finally:
        engine.engine.close()


@pytest.mark.slow
def test_rlvr_trains_with_the_calculator(tmp_path, tool_model, cache_dir):
    run_dir = tmp_path / "run"
    result = run_cli(["train", "model=local", f"model.path={tool_model}", "tools=calculator", "data.levels=[[2,2]]",
                      "data.batch_size=2", "algorithm.group_size=4", "rollout.max_tokens=64", "trainer.max_steps=2",
                      "trainer.samples_every=1", "data.eval_size=4", "eval.n_samples=0", "optim.lr=1e-4",
                      f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tools/calls" in r]
    assert steps and all(r["tools/calls"] > 0 and "tokens/tool" in r and "tools/turns" in r for r in steps)
    assert any("eval/tools/call_frac" in r for r in records)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["conversation"][0]["role"] == "assistant" for s in samples)  # whole conversations are written
    assert any([m["role"] for m in s["conversation"][:2]] == ["assistant", "tool"] for s in samples)


def test_a_bad_tool_fails_at_start_in_one_line(tmp_path, cache_dir):
    result = cli_here(["train", "model=tiny", "tools=calculator", "tools.calculator.parameters.type=objekt",
                      f"hydra.run.dir={tmp_path / 'run'}"], cache=cache_dir)
    assert result.returncode == 1
    assert "tools.calculator.parameters is not a valid JSON schema" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
