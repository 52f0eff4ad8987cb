"""Tasks: where prompts come from.

A task is any class named by `data._target_`; it is built with the keys of the `data` group
(except `_target_`) plus `seed`, and must offer the methods of `Task`.
"""

from __future__ import annotations

import random
from typing import Protocol

from rlvr.types import Prompt


class Task(Protocol):
    def sample(self, n: int) -> list[Prompt]:
        """`n` training prompts for the next step."""
        ...

    def eval_prompts(self) -> list[Prompt]:
        """The held-out prompts (the same every call; never drawn by `sample`)."""
        ...

    def update(self, accuracy: float) -> None:
        """Feedback after each step (a curriculum may use it; others ignore it)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Task state worth logging each step (e.g. `curriculum/level`); may be empty."""
        ...

    def state_dict(self) -> dict:
        """Everything `sample` depends on (RNG position, curriculum), JSON-serialisable, for checkpoints."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state_dict` was taken."""
        ...


def rng_state(rng: random.Random) -> list:
    """A `random.Random`'s state as JSON-ready lists (for a task's `state_dict`)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    """Undo `rng_state`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
