"""Function calling on real data: the Berkeley Function Calling Leaderboard (BFCL v4).

The leaderboard's package (`bfcl-eval`, Apache-2.0; `make install` installs it with `--no-deps`, for
its data alone: its own dependencies are provider SDKs and a pinned numpy) carries each category's
questions (`bfcl_eval/data/BFCL_v4_<category>.json`: chat turns and the functions offered, as BFCL's
schemas) and ground truth (`possible_answer/`: for each argument the list of acceptable values, `""`
marking one that may be left out). The package is found without importing it.

Each question becomes a `Prompt` whose functions are presented as the model's chat template presents
tools (`Prompt.tools`: its `tools=` where the template has one, else the rollouts' tool instructions in
the system message), so a call is written in the rollouts' protocol. `rlvr.rewards.bfcl.ast_call`
checks it by the leaderboard's AST rules.

Training draws from the `train` categories (the user-contributed `live_*` ones by default), evaluation
uses the `evaluate` ones (the leaderboard's `simple_python` and `multiple`). A training question whose
text is also an evaluated one is dropped, so the evaluation never sees a question the run trained on;
the log says how many were, and how many functions (by name) occur in both halves. Prompts longer than
the context are counted and dropped by the loop (rlvr.prompts), never cut.

Demonstrations for the cold start come from the training half's ground truth: one call, each argument
given its first acceptable value (left out where the ground truth allows it).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import random
from pathlib import Path

from rlvr.data import Passes
from rlvr.errors import RlvrError
from rlvr.records import Demonstration, Prompt
from rlvr.rewards.bfcl import ast_call
from rlvr.tools import CALL_CLOSE, CALL_OPEN

log = logging.getLogger("rlvr")

CATEGORIES = ("simple_python", "multiple", "live_simple", "live_multiple", "parallel", "parallel_multiple",
              "live_parallel", "live_parallel_multiple")
# BFCL's type names, as JSON Schema names them for a chat template's `tools=` (the checker keeps BFCL's).
JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


class BfclError(RlvrError, ValueError):
    """The BFCL data cannot be found or read; the message says what to install or which key to fix."""


def data_folder() -> Path:
    """`bfcl_eval/data` of the installed package, found without importing it (its `__init__` chain
    imports provider SDKs that are not installed)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclError("data=bfcl needs the leaderboard's data: pip install --no-deps bfcl-eval==2026.3.23 "
                        "(make install does)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load(category: str) -> list[dict]:
    """The rows of one category: {id, category, question (the first turn's messages), function (BFCL's
    schemas), ground_truth}."""
    if category not in CATEGORIES:
        raise BfclError(f"data: no BFCL category {category!r} with one-turn AST answers; choose from {CATEGORIES}")
    folder = data_folder()
    questions = _lines(folder / f"BFCL_v4_{category}.json")
    answers = {row["id"]: row["ground_truth"] for row in _lines(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
    return [{"id": q["id"], "category": category, "question": q["question"][0], "function": q["function"],
             "ground_truth": answers[q["id"]]} for q in questions]


def tool_schema(function: dict) -> dict:
    """A BFCL function as an OpenAI-style tool schema, its types as JSON Schema names them."""
    def convert(node):
        if isinstance(node, dict):
            out = {k: convert(v) for k, v in node.items()}
            if isinstance(out.get("type"), str):
                out["type"] = JSON_TYPES.get(out["type"], out["type"])
            return out
        return [convert(v) for v in node] if isinstance(node, list) else node

    return {"type": "function", "function": {"name": function["name"], "description": function.get("description", ""),
                                             "parameters": convert(function["parameters"])}}


def demonstration_call(ground_truth: list[dict], functions: list[dict]) -> str:
    """The call a demonstration writes for `ground_truth`: each argument's first acceptable value, an
    optional one that may be left out left out (nested dicts alike), in the rollouts' protocol.

    >>> fn = {"name": "area", "parameters": {"type": "dict", "required": ["base"], "properties": {}}}
    >>> demonstration_call([{"area": {"base": [10], "unit": ["units", ""]}}], [fn])
    '<tool_call>{"name": "area", "arguments": {"base": 10}}</tool_call>'
    """
    def pick(accepted: dict, required=()) -> dict:  # {argument: [acceptable values]} -> {argument: value}
        out = {}
        for k, values in accepted.items():
            given = [v for v in values if v != ""] if isinstance(values, list) else []
            if k in required and values == [""]:
                out[k] = ""  # (a required argument whose only acceptable value is the empty string)
            elif given and (k in required or "" not in values):
                out[k] = first(given[0])
        return out

    def first(value):  # a dict argument's value is itself {key: [acceptable values]}, one level deep
        if isinstance(value, dict):
            return {k: v[0] for k, v in value.items() if isinstance(v, list) and v and "" not in v}
        return [first(v) if isinstance(v, dict) else v for v in value] if isinstance(value, list) else value

    required = {f["name"]: (f.get("parameters") or {}).get("required") or [] for f in functions}
    return "".join(f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': pick(accepted, required.get(name, ()))})}"
                   f"{CALL_CLOSE}" for call in ground_truth for name, accepted in call.items())


class BfclTask:
    """BFCL questions (module docstring): `train` categories to train on, `evaluate` ones held out."""

    def __init__(self, train: list[str], evaluate: list[str], eval_size: int | None = None,
                 system_prompt: str | None = None, batch_size: int = 8, seed: int = 0):
        if not train or not evaluate:
            raise BfclError("data.train and data.evaluate must each name at least one BFCL category")
        if set(train) & set(evaluate):
            raise BfclError(f"data.train and data.evaluate share {sorted(set(train) & set(evaluate))}: a category "
                            "is trained on or evaluated, not both")
        self.system_prompt = system_prompt
        held = [self._prompt(row) for category in evaluate for row in load(category)]
        rows = [row for category in train for row in load(category)]
        asked = {p.messages[-1]["content"].strip() for p in held}
        kept = [row for row in rows if row["question"][-1]["content"].strip() not in asked]
        held_functions = {f["name"] for p in held for f in p.meta["functions"]}
        shared = {f["name"] for row in kept for f in row["function"]} & held_functions
        log.info("data=bfcl: %d questions to train on (%s), %d held out (%s); %d training questions dropped as "
                 "evaluated ones; %d function names occur in both halves", len(kept), "+".join(train), len(held),
                 "+".join(evaluate), len(rows) - len(kept), len(shared))
        self.overlap = {"questions_dropped": len(rows) - len(kept), "shared_function_names": sorted(shared)}
        self.train = [self._prompt(row) for row in kept]
        if eval_size is not None and eval_size < len(held):  # a fixed sample, the same for every run
            chosen = sorted(random.Random(12345).sample(range(len(held)), eval_size))
            held = [held[i] for i in chosen]
        self.eval = held
        self.passes = Passes(len(self.train), seed)

    def _prompt(self, row: dict) -> Prompt:
        messages = [{"role": m["role"], "content": m["content"]} for m in row["question"]]
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return Prompt(messages, json.dumps(row["ground_truth"]),
                      {"id": row["id"], "domain": row["category"], "functions": row["function"]},
                      tools=[tool_schema(f) for f in row["function"]])

    def sample(self, n: int) -> list[Prompt]:
        """The next `n` training questions; a new shuffled pass starts when one ends."""
        return [self.train[self.passes.next()] for _ in range(n)]

    @functools.cached_property
    def demonstrable(self) -> set[int]:
        """The training questions a demonstration can answer right: a few ground truths no call satisfies
        (a required argument with no acceptable value) are never shown. Worked out for a cold start only."""
        right = {i for i, p in enumerate(self.train)
                 if ast_call(demonstration_call(json.loads(p.answer), p.meta["functions"]), p) == 1.0}
        if len(right) < len(self.train):
            log.info("data=bfcl: %d training questions have a ground truth no call satisfies: never demonstrated",
                     len(self.train) - len(right))
        return right

    def demonstrations(self, n: int) -> list[Demonstration]:
        """The next `n` training questions with a worked answer: the ground truth's call (module docstring)."""
        out = []
        while len(out) < n:
            k = self.passes.next()
            if k in self.demonstrable:
                p = self.train[k]
                call = demonstration_call(json.loads(p.answer), p.meta["functions"])
                out.append(Demonstration(p, [{"role": "assistant", "content": call}]))
        return out

    def eval_prompts(self) -> list[Prompt]:
        return self.eval

    def update(self, accuracy: float) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"data/epoch": float(self.passes.epoch)}

    def state_dict(self) -> dict:
        return self.passes.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.passes.load_state_dict(state)
