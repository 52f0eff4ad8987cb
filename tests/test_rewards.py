"""Reward functions: their doctests, and tables of awkward model outputs (each case says why)."""

from __future__ import annotations

import doctest
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from rlvr.records import Prompt, Rollout
from rlvr.rewards import RewardError, Rewards, answer, combine, equivalence, structured, tags, text

from .conftest import REPO, reward_config

P = Prompt(messages=[], answer="1932")


@pytest.mark.parametrize("module", [answer, tags, text, equivalence, structured])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


ADVERSARIAL = [
    "", " ", "\n\n", "9" * 200_000, "<answer>" * 5_000, "</answer>" * 5_000, "<answer>" + "x" * 100_000,
    "ünïcödé 数字 ١٩٣٢ 🙂", "<answer>🙂</answer>", "<answer></answer>", "<answer><answer>1</answer></answer>",
    "1,234,567", "1,,2", "-", "--1", "1e99999", "\\boxed{", "\\boxed{\\boxed{3}", "{" * 10_000, "[" * 100_000,
    '{"name": 1}', '<answer>{"name": "f", "arguments": [1]}</answer>', "<think></think><answer>",
    "\x00\x01\x02", "NaN", "inf",
]
GOLD = [
    Prompt(messages=[], answer="1932", meta={"schema": {"type": "integer"}}),
    Prompt(messages=[], answer="\\frac{1}{2}", meta={"schema": {"type": "string"}}),
    Prompt(messages=[], answer='{"name": "get_weather", "arguments": {"city": "Oslo"}}',
           meta={"functions": ["get_weather", "set_timer"], "schema": {"type": "object"}}),
]
LIBRARY = [
    (answer.exact_match, {}), (answer.numeric_match, {"rel_tol": 0.01}), (answer.correct, {}),
    (answer.answer_format, {}), (answer.answer_format, {"kind": "call"}), (answer.think_answer_format, {}),
    (equivalence.math_equal, {}), (structured.json_valid, {}), (structured.json_schema_match, {}),
    (structured.function_name, {"fallback_mentioned": True}), (structured.function_call_match, {"partial": False}),
    (structured.function_call_match, {}),
    (text.length_penalty, {"limit": 10}), (text.starts_with, {"prefix": "1"}), (text.digit_fraction, {}),
]


@pytest.mark.parametrize("fn, kwargs", LIBRARY, ids=lambda x: getattr(x, "__name__", ""))
def test_every_reward_is_total_on_adversarial_outputs(fn, kwargs):
    """Whatever a model writes, a library reward returns a finite number in [-1, 1] and never raises.
    (Function-call rewards need a call as the ground truth: that is the task's side of the contract.)"""
    for completion in ADVERSARIAL:
        for prompt in GOLD[2:] if fn.__module__.endswith("structured") and "function" in fn.__name__ else GOLD:
            value = fn(completion, prompt, **kwargs)
            assert isinstance(value, float) and math.isfinite(value) and -1 <= value <= 1, (completion[:40], value)


def test_the_written_working_reward_is_total_on_adversarial_outputs():
    """The multiplication task's reward for its working reads the operands from the prompt, not the output."""
    from rlvr.data.multiplication import written_steps

    prompt = Prompt(messages=[], answer="179398", meta={"operands": [4721, 38]})
    for completion in ADVERSARIAL:
        value = written_steps(completion, prompt)
        assert isinstance(value, float) and 0 <= value <= 1, (completion[:40], value)


GSM = Prompt(messages=[], answer="She pays 3 * 24 = 72.\n#### 72")
HALF = Prompt(messages=[], answer="\\frac{1}{2}")
CALL = Prompt(messages=[], answer='{"name": "convert_currency", "arguments": {"amount": 20, "from_currency": "USD", '
                                  '"to_currency": "EUR"}}', meta={"functions": ["get_news", "convert_currency"]})
NAME_ONLY = Prompt(messages=[], answer='{"name": "set_timer"}', meta={"functions": ["get_news", "set_timer"]})


@pytest.mark.parametrize("fn, kwargs, completion, prompt, expected", [
    # exact match: normalisation options
    (answer.exact_match, {}, "<answer> The  PARIS! </answer>", Prompt([], "the paris"), 1.0),
    (answer.exact_match, {"lowercase": False}, "<answer>PARIS</answer>", Prompt([], "Paris"), 0.0),
    (answer.exact_match, {"strip_punctuation": False}, "<answer>Paris.</answer>", Prompt([], "Paris"), 0.0),
    (answer.exact_match, {"extract_from": "boxed"}, "<answer>Lyon</answer> \\boxed{Paris}", Prompt([], "Paris"), 1.0),
    (answer.exact_match, {}, "<answer>Paris", Prompt([], "Paris"), 0.0),  # unclosed tag, no number: nothing
    (answer.exact_match, {}, "Ünïcode <answer>Zürich</answer>", Prompt([], "zürich"), 1.0),  # unicode casefolds
    # numeric match: tolerance and the forms numbers take
    (answer.numeric_match, {}, "<answer>1,932</answer>", P, 1.0),  # commas
    (answer.numeric_match, {}, "so 1932.0", P, 1.0),  # no tags: the last number
    (answer.numeric_match, {}, "<answer>$1,932.00</answer>", P, 1.0),
    (answer.numeric_match, {"rel_tol": 0.001}, "<answer>1933</answer>", P, 1.0),
    (answer.numeric_match, {}, "<answer>1933</answer>", P, 0.0),
    (answer.numeric_match, {}, "<answer>1/2</answer>", Prompt([], "0.5"), 1.0),  # a fraction
    (answer.numeric_match, {}, "<answer>١٩٣٢</answer>", P, 0.0),  # non-ASCII digits are not read
    (answer.numeric_match, {}, "<answer>1e999</answer>", P, 0.0),  # overflow to inf is no number
    (answer.numeric_match, {}, "<answer><answer>1932</answer></answer>", P, 1.0),  # nested: innermost
    # boxed and the order of extraction in "auto"
    (answer.exact_match, {}, "\\boxed{\\text{1932}}", Prompt([], "\\text{1932}"), 1.0),  # nested braces
    (answer.numeric_match, {}, "\\boxed{12} and later <answer>1932</answer>", P, 1.0),  # tags before boxed
    (answer.numeric_match, {"extract_from": "boxed"}, "\\boxed{1932", P, 0.0),  # unclosed box
    # math equivalence (math-verify)
    (equivalence.math_equal, {}, "The answer is $\\boxed{\\frac{2}{4}}$", HALF, 1.0),
    (equivalence.math_equal, {}, "$\\boxed{0.5}$", HALF, 1.0),
    (equivalence.math_equal, {}, "$\\boxed{\\frac{1}{3}}$", HALF, 0.0),
    (equivalence.math_equal, {}, "So she pays $72.", GSM, 1.0),  # GSM8K-style gold after ####
    (equivalence.math_equal, {}, "So she pays $71.", GSM, 0.0),
    (equivalence.math_equal, {}, "<answer>1,932</answer>", P, 1.0),  # commas
    # think/answer format
    (answer.think_answer_format, {}, "<think>a</think>\n<answer>b</answer>", P, 1.0),
    (answer.think_answer_format, {}, "<think><think>a</think></think><answer>b</answer>", P, 0.5),  # nested think
    (answer.think_answer_format, {}, "<think>a</think><answer></answer>", P, 0.5),  # empty answer: not clean
    (answer.think_answer_format, {}, "<think>a<answer>b</answer>", P, 0.0),  # unclosed think
    (answer.think_answer_format, {}, "preamble <think>a</think><answer>b</answer>", P, 0.5),
    # JSON validity and schema
    (structured.json_valid, {}, '```json\n{"a": [1, 2]}\n```', P, 1.0),
    (structured.json_valid, {}, '<answer>{"a": 1,}</answer>', P, 0.0),
    (structured.json_valid, {}, "<answer>null</answer>", P, 1.0),
    (structured.json_schema_match, {"schema": {"type": "array", "items": {"type": "integer"}}}, "[1, 2]", P, 1.0),
    (structured.json_schema_match, {"schema": {"type": "array", "items": {"type": "integer"}}}, "[1, 2.5]", P, 0.0),
    # function calls: keys in any order, partial credit, bare names, arguments as a JSON string
    (structured.function_call_match, {}, '<answer>{"arguments": {"to_currency": "EUR", "amount": 20.0, '
                                         '"from_currency": "usd"}, "name": "convert_currency"}</answer>', CALL, 1.0),
    (structured.function_call_match, {}, '<answer>{"name": "convert_currency", "arguments": {"amount": 20, '
                                         '"from_currency": "USD"}}</answer>', CALL, 2 / 3),
    (structured.function_call_match, {"partial": False}, '<answer>{"name": "convert_currency", "arguments": '
                                                         '{"amount": 20, "from_currency": "USD"}}</answer>', CALL, 0.0),
    (structured.function_call_match, {}, '<answer>{"name": "convert_currency", "arguments": {"amount": 20, '
                                         '"from_currency": "USD", "to_currency": "EUR", "fee": 1}}</answer>', CALL, 0.75),
    (structured.function_call_match, {}, '<answer>{"name": "convert_currency", "arguments": "{\\"amount\\": 20, '
                                         '\\"from_currency\\": \\"USD\\", \\"to_currency\\": \\"EUR\\"}"}</answer>', CALL, 1.0),
    (structured.function_call_match, {}, '<answer>{"name": "get_news", "arguments": {"amount": 20}}</answer>', CALL, 0.0),
    (structured.function_call_match, {}, "<answer>convert_currency</answer>", CALL, 0.0),  # arguments asked for
    (structured.function_call_match, {}, "<answer>`set_timer()`</answer>", NAME_ONLY, 1.0),
    (structured.function_call_match, {}, "I'd use set_timer", NAME_ONLY, 0.0),  # no tags, no fallback
    (structured.function_call_match, {"fallback_mentioned": True}, "set_timer, not get_news", NAME_ONLY, 1.0),
    (structured.function_call_match, {"fallback_mentioned": True}, "get_news, not set_timer", NAME_ONLY, 0.0),
    (structured.function_call_match, {"fallback_mentioned": True}, "<answer>get_news</answer> set_timer", NAME_ONLY, 0.0),
    (structured.function_name, {}, '<answer>{"name": "convert_currency", "arguments": {}}</answer>', CALL, 1.0),
    (structured.function_name, {}, "<answer>{'name': 'convert_currency'}</answer>", CALL, 0.0),  # not JSON
    # length penalty
    (text.length_penalty, {"limit": 5, "span": 10}, "x" * 10, P, -0.5),
    (text.length_penalty, {"limit": 5}, "🙂" * 5, P, 0.0),  # characters, not bytes
])
def test_reward_table(fn, kwargs, completion, prompt, expected):
    assert fn(completion, prompt, **kwargs) == pytest.approx(expected)




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


def _rewards(terms: dict, **settings) -> Rewards:
    return Rewards(reward_config(terms, **settings))


def _rollout(text: str, prompt: Prompt = P) -> Rollout:
    return Rollout(prompt=prompt, group=0, prompt_ids=[], completion_ids=[], sampler_logprobs=[], text=text,
                   finish_reason="stop")


def test_weighted_total_and_a_raising_term_is_counted_not_fatal():
    rewards = _rewards({
        "correct": {"_target_": "rlvr.rewards.answer.correct", "weight": 1.0, "kwargs": {}},
        "format": {"_target_": "rlvr.rewards.answer.answer_format", "weight": 0.5, "kwargs": {}},
        "broken": {"_target_": "math.sqrt", "weight": 1.0, "kwargs": {}},  # sqrt(text, prompt) raises
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


def test_failed_calls_score_the_error_value_and_are_kept_with_the_sample(caplog):
    rewards = _rewards({
        "correct": {"_target_": "rlvr.rewards.answer.correct"},
        "nan": {"_target_": "math.fsum", "weight": 0.0},  # fsum(text, prompt) raises TypeError
        "inf": {"_target_": "tests.plugins.pid", "weight": 0.0},
    }, error_value=-1.0)
    rewards.fns["inf"] = lambda completion, prompt: float("inf")  # a reward that returns a non-finite number
    r = _rollout("<answer>1932</answer>")
    assert rewards.score([r]) == 2 and rewards.errors == 2
    assert r.rewards == {"correct": 1.0, "nan": -1.0, "inf": -1.0} and r.reward == 1.0
    assert r.reward_errors["nan"].startswith("TypeError") and r.reward_errors["inf"] == "returned inf"
    assert "'<answer>1932</answer>'" in caplog.text  # the warning shows the completion


def test_a_python_loop_past_the_timeout_is_interrupted_in_process():
    rewards = _rewards({"spin": {"_target_": "tests.plugins.spin"}}, timeout_s=0.5)
    t0 = time.perf_counter()
    done, stuck = _rollout("fine"), _rollout("spin forever")
    assert rewards.score([done, stuck]) == 1
    assert time.perf_counter() - t0 < 30  # generous: only "it returned at all" matters
    assert done.rewards["spin"] == 1.0 and stuck.rewards["spin"] == 0.0
    assert stuck.reward_errors["spin"] == "timed out after 0.5 s"


def test_workers_kill_a_hanging_reward_and_carry_on():
    """A reward stuck where no signal reaches it is killed with its worker; the others still score."""
    rewards = _rewards({"hang": {"_target_": "tests.plugins.hang"}, "pid": {"_target_": "tests.plugins.pid"},
                        "crash": {"_target_": "tests.plugins.crash"}}, timeout_s=2.0, workers=2)
    try:
        rollouts = [_rollout("hang here"), _rollout("fine"), _rollout("crash now"), _rollout("fine again")]
        assert rewards.score(rollouts) == 2
        hung, fine, crashed, _ = rollouts
        assert hung.reward_errors == {"hang": "timed out after 2 s (worker killed)"} and hung.rewards["hang"] == 0.0
        assert crashed.reward_errors["crash"] == "the reward worker died (exit code 3)"
        assert fine.rewards["hang"] == 1.0 and fine.rewards["pid"] not in (0.0, float(os.getpid()))
        workers = [p for p, _ in rewards.pool.workers]
        assert len(workers) == 2 and all(p.is_alive() for p in workers)  # the killed ones were replaced
        again = [_rollout("fine") for _ in range(3)]
        assert rewards.score(again) == 0 and {r.rewards["pid"] for r in again} <= {float(p.pid) for p in workers}
    finally:
        rewards.close()
    assert not any(p.is_alive() for p in workers)


def test_workers_score_like_the_training_process():
    terms = {"correct": {"_target_": "rlvr.rewards.answer.correct"},
             "format": {"_target_": "rlvr.rewards.answer.answer_format", "weight": 0.5}}
    texts = ["<answer>1932</answer>", "1932", "<answer>12", "", "<answer>x</answer>"]
    here, pooled = _rewards(terms), _rewards(terms, workers=2)
    try:
        a, b = [_rollout(t) for t in texts], [_rollout(t) for t in texts]
        here.score(a)
        pooled.score(b)
        assert [(r.rewards, r.reward) for r in a] == [(r.rewards, r.reward) for r in b]
    finally:
        pooled.close()


def test_combination_orders():
    rewards = _rewards({"correct": {"_target_": "rlvr.rewards.answer.correct", "weight": 1.0},
                        "length": {"_target_": "rlvr.rewards.text.length_penalty", "weight": 0.5,
                                   "kwargs": {"limit": 4}}})
    rollouts = [_rollout(t) for t in ["1932", "1932 is it", "12", "12 is it, or not"]]
    rewards.score(rollouts)
    summed = rewards.scores(rollouts, group_size=2)
    assert summed.flatten().tolist() == pytest.approx([1.0, 1.0 - 0.5 * 1.0, 0.0, -0.5])  # weighted sums
    rewards.order = "normalise_then_sum"
    each = rewards.scores(rollouts, group_size=2)
    # "correct" is constant in each group (normalises to 0); "length" to -/+0.707 (std of two values)
    assert each.flatten().tolist() == pytest.approx([0.5 * 0.7071, -0.5 * 0.7071] * 2, abs=1e-3)
    with pytest.raises(ValueError, match="reward.combine"):
        combine({"a": summed}, {"a": 1.0}, "average")


def test_a_worker_that_died_while_idle_is_replaced():
    rewards = _rewards({"pid": {"_target_": "tests.plugins.pid"}}, workers=1)
    try:
        first = _rollout("fine")
        rewards.score([first])
        [(process, _)] = rewards.pool.workers
        assert first.rewards["pid"] == process.pid
        process.kill()  # between two batches: nothing of it is in flight
        process.join()
        again = _rollout("fine")
        assert rewards.score([again]) == 0 and again.reward_errors == {}
        [(replacement, _)] = rewards.pool.workers
        assert replacement.is_alive() and again.rewards["pid"] == replacement.pid != process.pid
    finally:
        rewards.close()


# A trainer's process group under Ctrl-C: the trainer notes the signal and finishes its step, so its
# reward workers must go on scoring the calls they hold and the ones still to come.
CTRL_C = """
import json, signal
from rlvr.rewards import Rewards
from tests.conftest import reward_config
from rlvr.records import Prompt, Rollout

noted = []
signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
cfg = {"terms": {"nap": {"_target_": "tests.slow_rewards.nap", "kwargs": {"seconds": 0.5}}},
       "correct_term": "nap", "workers": 2, "timeout_s": 60}
rewards = Rewards(reward_config(**cfg))
batch = lambda n: [Rollout(prompt=Prompt(messages=[], answer="1"), group=0, prompt_ids=[], completion_ids=[],
                           sampler_logprobs=[], text="x", finish_reason="stop") for _ in range(n)]
first, second = batch(2), batch(8)
rewards.score(first)  # the workers are up
print("scoring", flush=True)
failed = rewards.score(second)  # 8 naps of 0.5 s on 2 workers: Ctrl-C arrives while they are in flight
print(json.dumps({"failed": failed, "noted": noted, "errors": [r.reward_errors for r in second],
                  "before": sorted({r.rewards["nap"] for r in first}),
                  "after": sorted({r.rewards["nap"] for r in second})}))
rewards.close()
"""


def test_reward_workers_ignore_ctrl_c_and_keep_scoring():
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # a process group of its own, like a terminal's job
    try:
        assert proc.stdout.readline() == "scoring\n", proc.stderr.read()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole group, the workers with it
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["noted"] == [signal.SIGINT]  # the signal did reach the group
    assert result["failed"] == 0 and not any(result["errors"]), result["errors"]
    assert result["after"] == result["before"] and len(result["before"]) == 2  # the same two workers
