"""Several tasks or datasets in one run (`data=mixture`): each source drawn with its weight, scored by
its own reward terms (rlvr.rewards.MixedRewards), held out and evaluated on its own.

Each prompt is tagged with its source (`meta["domain"]`), which is how the rewards find the terms
that fit it and how the metrics split by source (`<source>/accuracy`, `eval/<source>/accuracy`).
A step's `data.batch_size` prompts are split between the sources by a seeded draw with the weights
(so a step may hold more of one source than its share; over steps the shares are the weights).
A mixture of one source is that task's run, with its prompts tagged.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from rlvr.config_data import MixtureSource
from rlvr.data import Task, TaskError, make_task, rng_state, set_rng_state
from rlvr.records import Demonstration, Prompt


class Mixture:
    def __init__(self, batch_size: int, sources: dict[str, MixtureSource], seed: int, tokenizer=None):
        self.batch_size = batch_size
        self.weights = {name: source.weight for name, source in sources.items()}
        self.tasks: dict[str, Task] = {name: make_task(source.data, seed, lambda: tokenizer, f"data.sources.{name}.data")
                                       for name, source in sources.items()}
        self.rng = random.Random(f"mixture-{seed}")
        self.seen: tuple[int, dict[str, float]] | None = None  # (step, each source's accuracy) of its first round

    def _split(self, n: int) -> dict[str, int]:
        """How many of `n` come from each source: a seeded draw with the weights."""
        picks = self.rng.choices(list(self.weights), list(self.weights.values()), k=n)
        return {name: picks.count(name) for name in self.weights}

    def sample(self, n: int) -> list[Prompt]:
        return [tag(p, name) for name, k in self._split(n).items() if k for p in self.tasks[name].sample(k)]

    def eval_prompts(self) -> list[Prompt]:
        return [tag(p, name) for name, task in self.tasks.items() for p in task.eval_prompts()]

    def demonstrations(self, n: int) -> list[Demonstration]:
        """The cold start's demonstrations (`sft.data=task`), from the sources in their shares."""
        out = []
        for name, k in self._split(n).items():
            if not k:
                continue
            if not hasattr(self.tasks[name], "demonstrations"):
                raise TaskError(f"sft.data=task: the source {name} ({type(self.tasks[name]).__name__}) has no "
                                "demonstrations; give sft.data the path of a dataset of demonstrations")
            out += [dataclasses.replace(d, prompt=tag(d.prompt, name)) for d in self.tasks[name].demonstrations(k)]
        return out

    def observe(self, prompts: Sequence[Prompt], pass_rates: Sequence[float], step: int) -> None:
        """Each source's accuracy over the step's first round (rlvr.train.collect_groups), kept for `update`."""
        if self.seen is not None and self.seen[0] == step:
            return  # (dynamic sampling's later rounds: a one-task run's update sees the first round only)
        by: dict[str, list[float]] = {}
        for prompt, rate in zip(prompts, pass_rates, strict=True):
            by.setdefault(prompt.meta["domain"], []).append(rate)
        self.seen = step, {name: sum(rates) / len(rates) for name, rates in by.items()}

    def update(self, accuracy: float) -> None:
        """Each source's curriculum gets its own accuracy of the step (from `observe`), not the mixture's."""
        for name, own in (self.seen[1] if self.seen else {}).items():
            self.tasks[name].update(own)

    def metrics(self) -> dict[str, float]:
        return {f"{name}/{key}": value for name, task in self.tasks.items() for key, value in task.metrics().items()}

    def state_dict(self) -> dict:
        return {"rng": rng_state(self.rng), "sources": {name: task.state_dict() for name, task in self.tasks.items()}}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])
        for name, task in self.tasks.items():
            task.load_state_dict(state["sources"][name])


def tag(prompt: Prompt, source: str) -> Prompt:
    """`prompt` marked as the source's (its `meta["domain"]`; a source's own domains, e.g. BFCL's
    categories, give way to the source's name)."""
    return dataclasses.replace(prompt, meta={**prompt.meta, "domain": source})
