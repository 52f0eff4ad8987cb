"""The BFCL task and its AST reward, on the leaderboard's own data: every acceptable answer of the ground
truth scores 1, each corruption 0, the leaderboard's own checker agrees, the split never trains on an
evaluated question, and the functions reach the model as its chat template presents tools."""

from __future__ import annotations

import collections
import json
import random
import sys
import types

import pytest

from rlvr.data.bfcl import BfclTask, demonstration_call, load, tool_schema
from rlvr.records import Prompt
from rlvr.rewards.bfcl import ast_call, parse_calls, why_not
from rlvr.tools import CALL_CLOSE, CALL_OPEN

CATEGORIES = ["simple_python", "multiple", "live_simple", "live_multiple"]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [row for category in CATEGORIES for row in load(category)]


def _prompt(row: dict) -> Prompt:
    return Prompt([], json.dumps(row["ground_truth"]), {"functions": row["function"]})


def _call(name: str, args: dict) -> str:
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': args})}{CALL_CLOSE}"


def _satisfiable(row: dict) -> bool:
    """Whether the demonstration of `row` passes (four training rows' ground truths cannot: a required
    argument without an acceptable value, one the schema does not have)."""
    return ast_call(demonstration_call(row["ground_truth"], row["function"]), _prompt(row)) == 1.0


def test_the_data_is_the_leaderboards(rows):
    counts = collections.Counter(row["category"] for row in rows)
    assert counts == {"simple_python": 400, "multiple": 200, "live_simple": 258, "live_multiple": 1053}
    unsatisfiable = [row["id"] for row in rows if not _satisfiable(row)]
    assert len(unsatisfiable) == 4 and all(i.startswith("live_") for i in unsatisfiable), unsatisfiable


def test_every_acceptable_value_of_the_ground_truth_scores_one(rows):
    """For each argument of each question, each listed acceptable value in turn (the others at their
    first): 1. A value listed as "" (may be left out) is tried by leaving the argument out."""
    tried = 0
    for row in filter(_satisfiable, rows):
        (name, accepted), = row["ground_truth"][0].items()
        [(_, base)] = parse_calls(demonstration_call(row["ground_truth"], row["function"]))
        for arg, values in accepted.items():
            for value in values:
                args = {k: v for k, v in base.items() if k != arg}
                if value != "":
                    args[arg] = _plain(value)
                elif arg in base and arg in _required(row, name):
                    continue  # a required argument is never left out
                assert ast_call(_call(name, args), _prompt(row)) == 1.0, (row["id"], arg, value)
                tried += 1
                kind = next(f for f in row["function"] if f["name"] == name)["parameters"]["properties"][arg]["type"]
                if kind == "string" and isinstance(value, str) and value.strip():  # compared without case, spaces or ,./-_*^
                    args[arg] = " " + value.upper().replace(" ", "_") + "."
                    assert ast_call(_call(name, args), _prompt(row)) == 1.0, (row["id"], arg, args[arg])
    assert tried > 8000


def _plain(value):
    """An acceptable value as a model writes it (a dict argument's acceptable value holds lists)."""
    if isinstance(value, dict):
        return {k: v[0] for k, v in value.items() if isinstance(v, list) and v and "" not in v}
    return [_plain(v) if isinstance(v, dict) else v for v in value] if isinstance(value, list) else value


def _required(row: dict, name: str) -> list[str]:
    return next(f for f in row["function"] if f["name"] == name)["parameters"].get("required", [])


def _corruptions(row: dict, rng: random.Random) -> dict[str, str]:
    """The wrong answers of `row`'s ground truth, by what is wrong."""
    (name, accepted), = row["ground_truth"][0].items()
    [(_, args)] = parse_calls(demonstration_call(row["ground_truth"], row["function"]))
    others = [f["name"] for f in row["function"] if f["name"] != name]
    out = {"wrong function": _call(rng.choice(others) if others else name + "_v2", args),
           "extra unknown argument": _call(name, {**args, "no_such_argument": 1}),
           "two calls": _call(name, args) * 2,
           "the call in prose": f"I would call {name} with {json.dumps(args)}.",
           "a call cut short": _call(name, args)[:-5]}
    unlisted = [a for a in next(f for f in row["function"] if f["name"] == name)["parameters"]["properties"]
                if a not in accepted]
    if unlisted:  # a parameter the function has, but the ground truth does not list
        out["argument the ground truth does not list"] = _call(name, {**args, unlisted[0]: "x"})
    required = [a for a in _required(row, name) if a in args]
    if required:
        out["missing required argument"] = _call(name, {k: v for k, v in args.items() if k != required[0]})
    for arg, value in args.items():
        wrong = _wrong(value, accepted[arg])
        if wrong is not None:
            out["wrong value"] = _call(name, {**args, arg: wrong})
            break
    return out


def _wrong(value, acceptable):
    """A value of `value`'s type that no acceptable value matches, or None."""
    if isinstance(value, bool):
        wrong = not value
    elif isinstance(value, int | float):
        wrong = value + 7919
    elif isinstance(value, str):
        wrong = value + " zebra"
    else:
        return None
    return None if wrong in acceptable else wrong


def test_each_corruption_of_the_ground_truth_scores_zero(rows):
    rng = random.Random(0)
    seen = collections.Counter()
    for row in filter(_satisfiable, rows):
        for what, completion in _corruptions(row, rng).items():
            assert ast_call(completion, _prompt(row)) == 0.0, (row["id"], what, completion)
            seen[what] += 1
    assert min(seen.values()) >= 14 and len(seen) == 8, seen


@pytest.mark.parametrize("junk", ["", "<tool_call>", "<tool_call></tool_call>", "<tool_call>[1, 2]</tool_call>",
                                  '<tool_call>{"name": 3}</tool_call>', '<tool_call>{"name": "f", "arguments": "x"}'
                                  "</tool_call>", "</tool_call>" * 3, "\x00" * 50, "<tool_call>{" * 1000])
def test_the_reward_is_total_on_what_a_model_writes(rows, junk):
    for row in rows[::100]:
        assert ast_call(junk, _prompt(row)) == 0.0


def _leaderboards_checker():
    """The leaderboard's own `ast_checker`, imported from the installed package with its model registry
    stubbed: that module imports every provider's SDK, which the data-only install leaves out, and the
    checker reads it only to rename functions with dots for providers that forbid them."""
    pytest.importorskip("bfcl_eval")
    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = collections.defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
    sys.modules.setdefault("bfcl_eval.constants.model_config", registry)
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return lambda calls, row: ast_checker(row["function"], [{n: a} for n, a in calls], row["ground_truth"],
                                          Language.PYTHON, row["category"], "rlvr")["valid"]


def test_the_leaderboards_own_checker_agrees(rows):
    """On the ground truth, every corruption above and random edits of each argument (values of other
    types, other acceptable values, dropped and added arguments): the same verdict every time."""
    theirs = _leaderboards_checker()
    rng = random.Random(1)
    verdicts = collections.Counter()
    for row in rows:
        (name, accepted), = row["ground_truth"][0].items()
        [(_, args)] = parse_calls(demonstration_call(row["ground_truth"], row["function"]))
        candidates = [[(name, args)], *[parse_calls(c) for c in _corruptions(row, rng).values()]]
        for _ in range(6):
            edited = dict(args)
            properties = next(f for f in row["function"] if f["name"] == name)["parameters"]["properties"]
            arg = rng.choice([*accepted, *properties, "no_such_argument"])
            edited[arg] = rng.choice([1, 2.5, True, "x", [1], {"a": 1}, *[v for v in accepted.get(arg, []) if v != ""]])
            if rng.random() < 0.3:
                edited.pop(rng.choice(list(edited)))
            candidates.append([(name, edited)])
        for calls in candidates:
            if calls is None:
                continue
            ours = why_not(calls, row["function"], row["ground_truth"]) is None
            assert ours == theirs(calls, row), (row["id"], calls)
            verdicts[ours] += 1
    assert verdicts[True] > 2000 and verdicts[False] > 10000, verdicts


def test_the_split_never_trains_on_an_evaluated_question():
    task = BfclTask(["live_simple", "live_multiple"], ["simple_python", "multiple"])
    evaluated = {p.messages[-1]["content"].strip() for p in task.eval_prompts()}
    assert len(task.eval_prompts()) == 600 and {p.meta["domain"] for p in task.eval_prompts()} == {"simple_python",
                                                                                                     "multiple"}
    assert not evaluated & {p.messages[-1]["content"].strip() for p in task.train}
    assert task.overlap["questions_dropped"] == 1 and len(task.train) == 258 + 1053 - 1
    state = task.state_dict()
    drawn = [p.meta["id"] for p in task.sample(1400)]  # more than an epoch: every question, then again
    assert set(drawn) == {p.meta["id"] for p in task.train}
    task.load_state_dict(state)
    assert [p.meta["id"] for p in task.sample(1400)] == drawn
    demos = task.demonstrations(50)
    assert all(ast_call(d.turns[0]["content"], d.prompt) == 1.0 for d in demos)
    with pytest.raises(ValueError, match="share"):
        BfclTask(["multiple"], ["multiple"])


def test_functions_are_presented_as_the_template_presents_tools(tiny_path):
    """A template without `tools=` (the tiny model's, SmolLM2's) gets the rollouts' tool instructions in
    the system message; one with `tools=` that asks for rlvr's `<tool_call>` protocol (Qwen's) gets the
    schemas through it, with JSON Schema's type names."""
    from transformers import AutoTokenizer

    from rlvr.prompts import render

    task = BfclTask(["live_simple"], ["multiple"], eval_size=5)
    prompt = task.eval_prompts()[0]
    tok = AutoTokenizer.from_pretrained(tiny_path)
    text = tok.decode(render(tok, prompt))
    assert "You can call tools" in text and all(f'"name": "{f["name"]}"' in text for f in prompt.meta["functions"])
    assert '"type": "object"' in text and '"type": "dict"' not in text
    tok.chat_template = ("{% if tools %}TOOLS:{{ tools | tojson }} Call as <tool_call>{...}</tool_call>\n{% endif %}"
                         "{% for m in messages %}{{ m.role }}: "
                         "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    text = tok.decode(render(tok, prompt))
    assert text.startswith("TOOLS:") and "You can call tools" not in text
    schemas = text.split("\n")[0].removeprefix("TOOLS:").removesuffix(" Call as <tool_call>{...}</tool_call>")
    assert json.loads(schemas) == [tool_schema(f) for f in prompt.meta["functions"]]


def test_doctests():
    import doctest

    from rlvr.data import bfcl as data_bfcl
    from rlvr.rewards import bfcl as reward_bfcl

    for module in (data_bfcl, reward_bfcl):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


@pytest.mark.slow
def test_the_bfcl_recipe_runs_end_to_end_on_the_tiny_model(tmp_path, cache_dir):
    """`+experiment=bfcl` on the tiny model: the cold start on the training half's demonstrations, then an
    RL step scored by the AST check, evaluated per category; prompts too long for the context are
    counted, not cut."""
    from .conftest import run_cli

    run_dir = tmp_path / "run"
    result = run_cli(["train", "+experiment=bfcl", "model=tiny", "sft.steps=2", "sft.batch_size=4",
                      "sft.eval_every=0", "sft.warmup_steps=0", "data.batch_size=2", "algorithm.group_size=2",
                      "data.eval_size=6", "trainer.max_steps=1", "rollout.max_tokens=16", "learner.micro_batch_size=4",
                      "rollout.max_model_len=2048",  # (the tiny model's tokenizer writes ~3x the tokens)
                      f"hydra.run.dir={run_dir}"], cache=cache_dir)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "data=bfcl: 1310 questions to train on (live_simple+live_multiple), 600 held out" in out
    assert "training questions dropped as evaluated ones" in out and "prompts are longer than" in out
    sft = [json.loads(x) for x in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft if "loss" in r] == [1, 2]
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"eval/accuracy", "eval/simple_python/accuracy", "eval/multiple/accuracy", "eval/reward/call",
            "eval/reward/function"} <= final.keys()
