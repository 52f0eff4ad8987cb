"""The schemas of what a run draws and how it scores it: `data` (every task's keys, the schemas of the
tasks with knobs of their own, a user's task without one, a mixture's sources, how each step samples
its prompts) and `reward` (its terms and how they combine). rlvr.config puts them in the run's
`TrainConfig` and registers them with Hydra; each checks its own values, naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from rlvr.choices import Combine, Sampling
from rlvr.errors import ConfigError, need


@dataclass
class SamplingConfig:
    """How a step draws its training prompts (`data.sampling`; rlvr.data.sampling)."""

    mode: Sampling = MISSING
    candidates: int = MISSING
    rate: float = MISSING
    retire_after: int = MISSING
    retire_steps: int = MISSING
    floor: float = MISSING

    def check(self) -> None:
        need(self.candidates >= 1, "data.sampling.candidates", f"must be >= 1, got {self.candidates}")
        need(0 < self.rate <= 1, "data.sampling.rate", f"must be in (0, 1], got {self.rate}")
        need(self.retire_after >= 1, "data.sampling.retire_after", f"must be >= 1, got {self.retire_after}")
        need(self.retire_steps >= 0, "data.sampling.retire_steps", f"must be >= 0, got {self.retire_steps}")
        need(0 < self.floor <= 0.25, "data.sampling.floor",
             f"must be in (0, 0.25] (the weight at a pass rate of 0.5 is 0.25), got {self.floor}")


@dataclass
class DataConfig:
    _target_: str = MISSING
    batch_size: int = MISSING
    eval_size: int = MISSING
    system_prompt: str | None = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def check(self) -> None:
        need(self.batch_size >= 1, "data.batch_size", f"must be >= 1 (the prompts per step), got {self.batch_size}")
        need(self.eval_size >= 1, "data.eval_size",
             "must be >= 1 (the evaluation and the weight-sync canary use these prompts)")
        self.sampling.check()


@dataclass
class OpenDataConfig:
    """A user's task without a schema of its own: the keys rlvr reads itself, and the others (the task's
    own, passed to its constructor) as the YAML gave them."""

    _target_: str = MISSING
    batch_size: int = MISSING
    options: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingConfig | None = None  # (none in the YAML: uniform)

    @staticmethod
    def parse(data: dict[str, Any]) -> OpenDataConfig:
        """`data` as the YAML gave it: its class and prompts per step, and the task's own keys."""
        for key in ("_target_", "batch_size"):
            need(key in data, f"data.{key}", "must be set (every task names its class and the prompts per step)")
        sampling = data.get("sampling")
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            keys = [f.name for f in dataclasses.fields(SamplingConfig)]
            need(isinstance(sampling, dict) and sorted(sampling) == sorted(keys), "data.sampling",
                 f"takes {', '.join(keys)}, each set: list _sampling in the task's defaults (then override any)")
            sampling = SamplingConfig(**sampling)
        return OpenDataConfig(data["_target_"], data["batch_size"],
                              {k: v for k, v in data.items() if k not in ("_target_", "batch_size", "sampling")},
                              sampling)

    def check(self) -> None:  # (the task's constructor checks its own keys)
        need(self.batch_size >= 1, "data.batch_size", f"must be >= 1 (the prompts per step), got {self.batch_size}")
        if self.sampling is not None:
            self.sampling.check()


@dataclass
class MultiplicationDataConfig(DataConfig):
    levels: list[list[int]] = MISSING
    advance_at: float | None = MISSING
    window: int = MISSING
    eval_fraction: float = MISSING
    template: str = MISSING
    demonstration: str = MISSING


@dataclass
class FunctionPickingDataConfig(DataConfig):
    distractors: int = MISSING
    arguments: str = MISSING
    eval_fraction: float = MISSING
    template: str = MISSING


@dataclass
class BfclDataConfig(DataConfig):
    train: list[str] = MISSING
    evaluate: list[str] = MISSING


@dataclass
class FileDataConfig(DataConfig):
    path: str = MISSING
    format: str = MISSING
    split: str | None = MISSING
    prompt_key: str | None = MISSING
    answer_key: str = MISSING
    messages_key: str | None = MISSING
    system_key: str | None = MISSING
    prompt_template: str = MISSING
    eval_path: str | None = MISSING
    eval_split: str | None = MISSING
    shuffle: bool = MISSING
    max_prompt_tokens: int | None = MISSING


@dataclass
class MixtureSource:
    """One source of `data=mixture`: its sampling weight, and the data and reward options it is drawn
    and scored with (placed by the experiment's defaults)."""

    weight: float = MISSING
    data: Any = MISSING  # typed by the data option's own schema
    reward: RewardConfig = MISSING


@dataclass
class MixtureDataConfig:
    """`data=mixture` (rlvr.data.mixture)."""

    _target_: str = MISSING
    batch_size: int = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    sources: dict[str, MixtureSource] = field(default_factory=dict)

    def check(self) -> None:
        need(self.batch_size >= 1, "data.batch_size", f"must be >= 1 (the prompts per step), got {self.batch_size}")
        self.sampling.check()
        need(len(self.sources) >= 1, "data.sources", "a mixture needs at least one source: add /data@data.sources."
             "NAME.data and /reward@data.sources.NAME.reward to the experiment's defaults (docs/tasks.md#mixtures)")
        for name, source in self.sources.items():
            where = f"data.sources.{name}"
            need(source.weight > 0, f"{where}.weight", f"must be > 0, got {source.weight}")
            need(getattr(source.data, "sampling", None) is None or source.data.sampling.mode == "uniform",
                 f"{where}.data.sampling.mode", "a mixture draws by difficulty as a whole: set data.sampling.mode")
            try:
                source.data.check()
                source.reward.check()
            except ConfigError as e:  # (a source's keys named where they are)
                raise ConfigError(f"{where}.{e}") from e


@dataclass
class RewardTerm:
    """One term of `reward.terms` (a term with no weight or kwargs takes these)."""

    _target_: str = MISSING
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def parse(name: str, term: Any) -> RewardTerm:
        """The term `name` of `reward.terms` from its mapping, its types checked (the schema leaves terms
        untyped)."""
        key = f"reward.terms.{name}"
        need(isinstance(term, dict) and isinstance(term.get("_target_"), str), f"{key}._target_",
             "is missing: each term names its reward function by dotted path")
        weight = term.get("weight", RewardTerm.weight)
        need(isinstance(weight, int | float) and not isinstance(weight, bool), f"{key}.weight",
             f"must be a number, got {weight!r}")
        kwargs = term.get("kwargs") or {}
        need(isinstance(kwargs, dict), f"{key}.kwargs", "must be a mapping of the function's keyword arguments")
        return RewardTerm(term["_target_"], float(weight), kwargs)


@dataclass
class RewardConfig:
    # Each term is a RewardTerm, left untyped here so that `+reward.terms.NAME._target_=...` can add one
    # from the command line (OmegaConf cannot create a dataclass node there); rlvr.keys and `check`
    # hold every term to RewardTerm's keys and types.
    terms: dict[str, Any] = field(default_factory=dict)
    correct_term: str = MISSING
    timeout_s: float | None = MISSING
    error_value: float = MISSING
    workers: int = MISSING
    combine: Combine = MISSING

    def check(self) -> None:
        need(self.correct_term in self.terms, "reward.correct_term",
             f"names the term that defines accuracy; {self.correct_term!r} is not one of {list(self.terms)}")
        need(self.timeout_s is None or self.timeout_s >= 0, "reward.timeout_s", "must be >= 0 (0 or null: none)")
        need(self.workers >= 0, "reward.workers", "must be >= 0 (0: score in this process)")


def reward_terms(terms: dict[str, Any]) -> dict[str, RewardTerm]:
    """`reward.terms` as RewardTerms (each a mapping of _target_, weight, kwargs; or a RewardTerm)."""
    return {name: term if isinstance(term, RewardTerm) else RewardTerm.parse(name, term)
            for name, term in terms.items()}


def task_options(data: DataConfig | OpenDataConfig) -> dict[str, Any]:
    """The keyword arguments of a task's constructor: every key of `data` but `_target_` and `sampling`
    (how the run draws from the task: rlvr.data.sampling)."""
    if isinstance(data, OpenDataConfig):
        return {"batch_size": data.batch_size, **data.options}
    return {f.name: getattr(data, f.name) for f in dataclasses.fields(data) if f.name not in ("_target_", "sampling")}
