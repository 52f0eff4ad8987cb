"""Synthetic multiplication a × b (the seed experiment), with a digit-count curriculum.

Problems are split once and for all by a hash of "a*b": a fixed `eval_fraction` of all
problems is held out for evaluation and never drawn for training, at every level and seed.
"""

from __future__ import annotations

import json
import random

from rlvr.data import chat, is_held_out, rng_state, set_rng_state
from rlvr.records import Demonstration, Prompt
from rlvr.tools import CALL_CLOSE, CALL_OPEN

DEMONSTRATIONS = ("written", "calculator")


class MultiplicationTask:
    """Yields chat prompts "What is a * b?" with the product as the answer.

    `levels` lists [digits of a, digits of b], easiest first; training starts at the first and
    moves up one level when the mean accuracy of the last `window` steps reaches `advance_at`.
    """

    def __init__(self, levels: list[list[int]], template: str, system_prompt: str | None = None,
                 advance_at: float | None = None, window: int = 4, eval_fraction: float = 0.1,
                 eval_size: int = 64, batch_size: int = 8, seed: int = 0, demonstration: str = "written"):
        if not levels or any(len(lv) != 2 or min(lv) < 1 for lv in levels):
            raise ValueError(f"data.levels must be a non-empty list of [digits_a, digits_b] pairs >= 1, got {levels}")
        if not 0 < eval_fraction < 1:
            raise ValueError(f"data.eval_fraction must be in (0, 1), got {eval_fraction}")
        for key in ("{a}", "{b}"):
            if key not in template:
                raise ValueError(f"data.template must contain {key}: {template!r}")
        if demonstration not in DEMONSTRATIONS:
            raise ValueError(f"data.demonstration must be one of {DEMONSTRATIONS}, got {demonstration!r}")
        self.demonstration = demonstration
        self.levels = [tuple(lv) for lv in levels]
        self.template, self.system_prompt = template, system_prompt
        self.advance_at, self.window = advance_at, window
        self.eval_fraction, self.eval_size, self.batch_size = eval_fraction, eval_size, batch_size
        self.rng = random.Random(seed)
        self.level = 0
        self.history: list[float] = []

    def _operands(self, rng: random.Random, level: int, held_out: bool) -> tuple[int, int]:
        da, db = self.levels[level]
        for _ in range(10_000):
            a = rng.randint(10 ** (da - 1), 10**da - 1)
            b = rng.randint(10 ** (db - 1), 10**db - 1)
            if is_held_out(f"{a}*{b}", self.eval_fraction) == held_out:
                return a, b
        raise RuntimeError(f"no {'eval' if held_out else 'training'} problem found at level {da}x{db}")

    def _prompt(self, a: int, b: int, level: int) -> Prompt:
        da, db = self.levels[level]
        return Prompt(messages=chat(self.template.format(a=a, b=b), self.system_prompt), answer=str(a * b),
                      meta={"level": f"{da}x{db}", "operands": [a, b]})

    def sample(self, n: int) -> list[Prompt]:
        """`n` training prompts at the current curriculum level."""
        return [self._prompt(*self._operands(self.rng, self.level, False), self.level) for _ in range(n)]

    def demonstrations(self, n: int) -> list[Demonstration]:
        """`n` worked answers to training problems at the current level (never a held-out one: they are
        drawn as `sample` draws), written out or with the calculator (`data.demonstration`)."""
        out = []
        for prompt in self.sample(n):
            a, b = (int(x) for x in prompt.meta["operands"])
            if self.demonstration == "calculator":
                call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
                turns = [{"role": "assistant", "content": f"{CALL_OPEN}{call}{CALL_CLOSE}"},
                         {"role": "tool", "content": str(a * b)},
                         {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]
            else:
                turns = [{"role": "assistant", "content": written_out(a, b)}]
            out.append(Demonstration(prompt, turns))
        return out

    def eval_prompts(self) -> list[Prompt]:
        """The held-out set: up to `eval_size` distinct problems, spread evenly over the levels."""
        rng = random.Random(12345)  # fixed: the same eval set for every run
        per_level = -(-self.eval_size // len(self.levels))
        prompts = []
        for level in range(len(self.levels)):
            seen: set[tuple[int, int]] = set()
            for _ in range(per_level * 20):
                if len(seen) == per_level:
                    break
                seen.add(self._operands(rng, level, True))
            prompts += [self._prompt(a, b, level) for a, b in sorted(seen)]
        return prompts[: self.eval_size]

    def update(self, accuracy: float) -> None:
        """Curriculum feedback after each step: go up a level when recent accuracy is high enough."""
        self.history.append(accuracy)
        recent = self.history[-self.window:]
        if (self.advance_at is not None and self.level + 1 < len(self.levels)
                and len(recent) == self.window and sum(recent) / self.window >= self.advance_at):
            self.level += 1
            self.history.clear()

    def metrics(self) -> dict[str, float]:
        return {"curriculum/level": float(self.level)}

    def state_dict(self) -> dict:
        """Sampler position and curriculum state, JSON-ready (for checkpoints)."""
        return {"rng": rng_state(self.rng), "level": self.level, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])
        self.level, self.history = state["level"], list(state["history"])


def written_out(a: int, b: int) -> str:
    """Long multiplication written out: a times each non-zero digit of b in its place, units first, then
    the running sum of those partial products, then the answer in tags.

    >>> print(written_out(4721, 38))
    4721 * 8 = 37768
    4721 * 30 = 141630
    37768 + 141630 = 179398
    <answer>179398</answer>
    """
    parts = [(int(d) * 10**i) for i, d in enumerate(reversed(str(b))) if d != "0"] or [0]
    lines = [f"{a} * {p} = {a * p}" for p in parts]
    total = a * parts[0]
    for p in parts[1:]:
        lines.append(f"{total} + {a * p} = {total + a * p}")
        total += a * p
    return "\n".join([*lines, f"<answer>{a * b}</answer>"])


def written_steps(completion: str, prompt: Prompt) -> float:
    """A reward for the working, not only the answer: the share of `written_out`'s lines (each partial
    product, each running sum) that the completion writes as a line of its own. A wrong answer whose
    working is right up to one product scores between 0 and 1, so a group whose answers are all wrong
    still differs in reward (the final answer is for `rlvr.rewards.answer.correct` to score).

    >>> p = Prompt(messages=[], answer="179398", meta={"operands": [4721, 38]})
    >>> written_steps(written_out(4721, 38), p)
    1.0
    >>> written_steps("4721 * 8 = 37768\\n4721 * 30 = 141530\\n37768 + 141530 = 179298", p)
    0.3333333333333333
    >>> written_steps("<answer>179398</answer>", p)
    0.0
    """
    a, b = (int(x) for x in prompt.meta["operands"])
    steps = written_out(a, b).splitlines()[:-1]
    lines = {line.strip() for line in completion.splitlines()}
    return sum(step in lines for step in steps) / len(steps)
