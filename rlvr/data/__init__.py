"""Tasks: where prompts come from.

A task is any class named by `data._target_`; it is built with the keys of the `data` group
(except `_target_`) plus `seed`, and must offer the methods of `Task`. A task whose constructor
takes `tokenizer` also gets the model's tokenizer. Whatever the task, the training loop checks
its prompts against the engine's context (`rlvr.prompts.PromptFit`).
"""

from __future__ import annotations

import inspect
import random
import zlib
from pathlib import Path
from typing import Protocol

from rlvr.config import TrainConfig
from rlvr.config_data import task_options
from rlvr.errors import RlvrError, import_failure
from rlvr.records import Prompt


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

    # Optional: `observe(prompts, pass_rates, step)`, each drawn prompt's group pass rate as soon as it is
    # scored, every sampling round (rlvr.data.sampling and rlvr.data.mixture use it).

    def metrics(self) -> dict[str, float]:
        """Task state worth logging each step (e.g. `curriculum/level`); may be empty."""
        ...

    def state_dict(self) -> dict:
        """Everything `sample` depends on (RNG position, curriculum), JSON-serialisable, for checkpoints."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state_dict` was taken."""
        ...


class StageSource(Protocol):
    """What a stage that draws its own data instead of the task's prompts (the cold start's
    demonstrations, rlvr.sft; a dataset's preference pairs, rlvr.preference) answers for the run in the
    task's place: the task's training prompts (checked at start against the context, for the stage
    after it) and held-out prompts (the evaluation), and for checkpoints its own position with the
    task's state. Its `next(n)` is the stage's own."""

    def sample(self, n: int) -> list[Prompt]: ...

    def eval_prompts(self) -> list[Prompt]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def seeded_draw(count: int, seed: int, position: int, n: int) -> list[int]:
    """Indices of the next `n` of `count` items from `position` on, in a seeded shuffled order per
    epoch, epoch after epoch (the same for every process and every resume).

    >>> seeded_draw(3, 0, 0, 6)[:3] == seeded_draw(3, 0, 0, 3) and sorted(seeded_draw(3, 0, 3, 3))
    [0, 1, 2]
    """
    out = []
    for at in range(position, position + n):
        epoch, k = divmod(at, count)
        order = list(range(count))
        random.Random(f"{seed}-{epoch}").shuffle(order)
        out.append(order[k])
    return out


def is_held_out(key: str, fraction: float) -> bool:
    """Whether the item named `key` belongs to the evaluation split: a hash of the key, so the same
    for every run, seed and machine."""
    return zlib.crc32(key.encode()) % 10_000 < fraction * 10_000


def chat(user: str, system: str | None = None) -> list[dict[str, str]]:
    """Chat messages of one user turn, after a system message when one is given."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]


def rng_state(rng: random.Random) -> list:
    """A `random.Random`'s state as JSON-ready lists (for a task's `state_dict`)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    """Undo `rng_state`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class Passes:
    """Indices of `size` training items, pass after pass (`epoch` counts them), each pass in a new
    seeded order (in item order with `shuffle=False`); its state goes into the task's checkpoint."""

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        self.size, self.shuffle, self.rng = size, shuffle, random.Random(seed)
        self.order: list[int] = []
        self.position, self.epoch = 0, 0

    def next(self) -> int:
        if self.position >= len(self.order):
            self.order = list(range(self.size))
            if self.shuffle:
                self.rng.shuffle(self.order)
            self.position, self.epoch = 0, self.epoch + 1
        self.position += 1
        return self.order[self.position - 1]

    def state_dict(self) -> dict:
        return {"rng": rng_state(self.rng), "order": self.order, "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])
        self.order, self.position, self.epoch = list(state["order"]), state["position"], state["epoch"]


class TaskError(RlvrError, ValueError):
    """A task that cannot be built from the `data` config; the message says which key or file."""


def build_task(cfg: TrainConfig, model_path: Path | None = None) -> Task:
    """The task of `cfg.data`, built as the module docstring says; drawn by difficulty when
    `data.sampling.mode` says so (rlvr.data.sampling)."""

    def tokenizer():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path) if model_path is not None else None

    task = make_task(cfg.data, cfg.seed, tokenizer)
    sampling = cfg.data.sampling
    if sampling is not None and sampling.mode == "difficulty":
        from rlvr.data.sampling import DifficultySampling

        return DifficultySampling(task, sampling, cfg.seed)
    return task


def make_task(data, seed: int, tokenizer, where: str = "data") -> Task:
    """The task a data config (`data`, at the key `where`) names: its class built with the config's keys,
    `seed`, and `tokenizer()` when the constructor takes a tokenizer."""
    from hydra.utils import get_class

    try:
        cls = get_class(data._target_)
    except Exception as e:  # hydra wraps the import error
        raise TaskError(f"{where}._target_={data._target_!r} cannot be imported: "
                        f"{import_failure(data._target_, e)}") from e
    kwargs = task_options(data)
    params = inspect.signature(cls).parameters
    unknown = sorted(k for k in kwargs if k not in params) if not any(
        p.kind is p.VAR_KEYWORD for p in params.values()) else []
    if unknown:
        raise TaskError(f"{where}: {data._target_} takes no key {unknown[0]!r} (it takes {sorted(params)})")
    kwargs["seed"] = seed
    if "tokenizer" in params and (loaded := tokenizer()) is not None:
        kwargs["tokenizer"] = loaded
    try:
        return cls(**kwargs)
    except RlvrError:
        raise
    except (ValueError, TypeError) as e:  # a task's own check of its keys
        raise TaskError(f"{where} ({data._target_}): {e}") from e
