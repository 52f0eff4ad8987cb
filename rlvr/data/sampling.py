"""Which training prompts a step draws: the task's own order, or by difficulty (`data.sampling`).

A group whose answers are all right or all wrong has advantage 0 everywhere: its rollouts are paid
for and teach nothing. With `mode: difficulty` the run keeps each prompt's recent pass rate p (the
share of its group the correct term accepted, as an exponential mean over the times it was drawn,
weight `rate`) and each step asks the task for `candidates` times the prompts it needs, then keeps:

- none that is retired: a prompt its whole group solved `retire_after` times in a row sits out the
  next `retire_steps` steps;
- of the rest, a weighted draw without replacement, weight p(1 - p) (the variance of the group's
  rewards: what a group-relative advantage has to learn from), at least `floor`; a prompt never drawn
  weighs as p = 0.5, so new prompts are tried before known ones are repeated.

How it meets the rest of a run:
- The held-out prompts are never sampled (the task keeps them apart), so pass rates are those of
  training prompts only and the evaluation stays a fair sample of the task.
- DAPO's dynamic sampling (`algorithm.dynamic_sampling`) still drops the groups that came out flat and
  draws again; difficulty-aware sampling makes those rounds rarer. Every round's groups update the pass
  rates, the discarded ones too (their rollouts were paid for).
- A generator task (multiplication) rarely draws a prompt twice: retiring does little there, and the
  draw favours nothing it has not seen; a dataset, pass after pass, is where it pays.
- A prompt too long for the engine's context (rlvr.prompts.PromptFit drops it) is never offered
  again: unseen, it would weigh as much as any prompt and be drawn and dropped step after step.
- The pass rates are part of the task's state in checkpoints: a resumed run draws what it would have.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence

from rlvr.config_data import SamplingConfig
from rlvr.data import Task, rng_state, set_rng_state
from rlvr.records import Prompt

UNSEEN = 0.5  # the pass rate a prompt never drawn counts as


def prompt_key(prompt: Prompt) -> str:
    """A short stable name of a prompt: a hash of its messages and answer (the same on every run)."""
    text = json.dumps([prompt.messages, prompt.answer, prompt.meta.get("domain")], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class DifficultySampling:
    """A task whose `sample` draws by difficulty (module docstring); every other method is the task's.
    `observe` takes each group's pass rate after it is scored."""

    def __init__(self, task: Task, cfg: SamplingConfig, seed: int):
        self.task, self.cfg = task, cfg
        self.rng = random.Random(f"sampling-{seed}")
        self.rates: dict[str, float] = {}  # prompt key -> recent pass rate
        self.solved: dict[str, int] = {}  # prompt key -> times in a row its whole group was right
        self.retired: dict[str, int] = {}  # prompt key -> the last step it sits out
        self.too_long: set[str] = set()  # prompt keys the context cannot hold: never drawn
        self.step = 0  # the last step observed
        self.discarded = 0  # candidates the task offered that were not drawn, since the last `metrics`

    def weight(self, key: str) -> float:
        p = self.rates.get(key, UNSEEN)
        return max(p * (1 - p), self.cfg.floor)

    def sample(self, n: int) -> list[Prompt]:
        """`n` prompts: `candidates * n` of the task's, the retired ones left out, then a weighted draw."""
        offered = self.task.sample(self.cfg.candidates * n)
        keys = [prompt_key(p) for p in offered]
        fits = [i for i, k in enumerate(keys) if k not in self.too_long]
        open_ = [i for i in fits if self.retired.get(keys[i], -1) < self.step + 1]
        if len(open_) < n:  # (too few not retired: the retired ones fill up, the least solved first)
            open_ += sorted(set(fits) - set(open_), key=lambda i: -self.weight(keys[i]))[: n - len(open_)]
        chosen = _weighted_draw(self.rng, [self.weight(keys[i]) for i in open_], n)
        self.discarded += len(offered) - len(chosen)
        return [offered[open_[j]] for j in sorted(chosen)]

    def dropped(self, prompts: Sequence[Prompt]) -> None:
        """Prompts drawn but too long for the context (rlvr.prompts.PromptFit.sample): never offered again."""
        self.too_long.update(prompt_key(p) for p in prompts)

    def observe(self, prompts: Sequence[Prompt], pass_rates: Sequence[float], step: int) -> None:
        """Each drawn prompt's group pass rate at `step` (rlvr.train.collect_groups, every round)."""
        if observe := getattr(self.task, "observe", None):  # (a mixture's)
            observe(prompts, pass_rates, step)
        self.step = step
        for prompt, p in zip(prompts, pass_rates, strict=True):
            key = prompt_key(prompt)
            self.rates[key] = p if key not in self.rates else self.rates[key] + self.cfg.rate * (p - self.rates[key])
            self.solved[key] = self.solved.get(key, 0) + 1 if p >= 1.0 else 0
            if self.cfg.retire_steps and self.solved[key] >= self.cfg.retire_after:
                self.retired[key] = step + self.cfg.retire_steps
                self.solved[key] = 0

    def metrics(self) -> dict[str, float]:
        """The task's own, and the sampler's: prompts tracked and retired now, candidates passed over
        since the last call."""
        out = {**self.task.metrics(), "sampling/tracked": float(len(self.rates)),
               "sampling/retired": float(sum(last > self.step for last in self.retired.values())),
               "sampling/passed_over": float(self.discarded)}
        self.discarded = 0
        return out

    def eval_prompts(self) -> list[Prompt]:
        return self.task.eval_prompts()

    @property
    def demonstrations(self):
        """The task's demonstrations (an AttributeError where it has none: `hasattr` says so)."""
        return self.task.demonstrations

    def update(self, accuracy: float) -> None:
        self.task.update(accuracy)

    def state_dict(self) -> dict:
        return {"task": self.task.state_dict(), "rng": rng_state(self.rng), "rates": self.rates,
                "solved": self.solved, "retired": self.retired, "step": self.step, "too_long": sorted(self.too_long)}

    def load_state_dict(self, state: dict) -> None:
        self.task.load_state_dict(state["task"])
        set_rng_state(self.rng, state["rng"])
        self.rates, self.solved, self.retired = dict(state["rates"]), dict(state["solved"]), dict(state["retired"])
        self.step = state["step"]
        self.too_long = set(state.get("too_long", []))  # (absent from checkpoints written before it was kept)
        self.discarded = 0  # (what a draw before the load passed over is not this run's)


def _weighted_draw(rng: random.Random, weights: list[float], n: int) -> list[int]:
    """`n` distinct indices of `weights`, each draw in proportion to the weights left (all when fewer).

    >>> _weighted_draw(random.Random(0), [1.0, 0.0001, 1.0], 2)
    [0, 2]
    """
    left = list(range(len(weights)))
    out = []
    for _ in range(min(n, len(left))):
        at = rng.random() * sum(weights[i] for i in left)
        for j, i in enumerate(left):
            at -= weights[i]
            if at <= 0 or j == len(left) - 1:
                out.append(left.pop(j))
                break
    return out
