"""Verifiable rewards and their weighted combination.

A reward term is any `fn(completion: str, prompt: Prompt, **kwargs) -> float`, named in the
`reward` config by dotted path (`_target_`) with a weight and keyword arguments. The total is the
weighted sum of the terms; every term is also logged on its own as `reward/<name>`.

A `_target_` that is a class is a batched term (model-based rewards, `rlvr.rewards.models`): it is
built once at start from its kwargs (plus `device`, the learner's, when its constructor takes one and
the config does not set it), then called once per batch, `term(completions, prompts) -> list[float]`,
in this process. A term with an `attach(engine, tokenizer)` method gets the policy's engine once
it runs (a judge that is the policy itself).

A call that raises, returns a non-finite number, or runs past `reward.timeout_s` scores
`reward.error_value` for that sample; it is counted (`reward/errors`), logged with the completion,
and kept in the sample's record. With `reward.workers: 0` calls run in this process and the timeout
is a SIGALRM timer (it interrupts Python code, not a C call that never returns); with
`workers > 0` they run in a pool of processes and a call past its timeout has its worker killed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from hydra.utils import get_method

from rlvr.choices import Combine
from rlvr.config_data import RewardConfig
from rlvr.errors import RlvrError, import_failure
from rlvr.records import Rollout
from rlvr.rewards.pool import Call, Outcome, RewardPool
from rlvr.timeout import call_with_timeout

if TYPE_CHECKING:  # imported where used: reward worker processes start without torch
    import torch

log = logging.getLogger(__name__)

SHOWN_ERRORS = 3  # detailed warnings per batch; the rest are counted


class RewardError(RlvrError, ValueError):
    """A reward term that cannot be loaded; the message names the term."""


def combine(terms: dict[str, torch.Tensor], weights: dict[str, float], order: str = "sum_then_normalise",
            eps: float = 1e-6) -> torch.Tensor:
    """Scores [P, G] for the advantages from per-term rewards [P, G] (P prompts, G samples each).

    "sum_then_normalise": the weighted sum (the advantage then normalises it within each group);
    "normalise_then_sum": each term normalised within its group first, (r - mean) / (std + eps),
    then the weighted sum, so a term with a large spread cannot drown the others.

    >>> import torch
    >>> t = {"a": torch.tensor([[0.0, 1.0]]), "b": torch.tensor([[0.0, 10.0]])}
    >>> combine(t, {"a": 1.0, "b": 1.0}).tolist(), combine(t, {"a": 1.0, "b": 1.0}, "normalise_then_sum").round().tolist()
    ([[0.0, 11.0]], [[-1.0, 1.0]])
    """
    if order == "normalise_then_sum":
        from rlvr.algorithms.advantages import grpo  # the same normalisation: a flat term gives exactly 0

        terms = {n: grpo(t, eps) for n, t in terms.items()}
    elif order != "sum_then_normalise":
        raise ValueError(f"reward.combine must be one of {[c.value for c in Combine]}, got {order!r}")
    return sum(weights[n] * t for n, t in terms.items())


def _parameters(fn) -> list[str]:
    """The names `fn` takes, or none where Python cannot read its signature (builtins such as `int`)."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


class Rewards:
    """The configured reward terms, loaded once at startup."""

    def __init__(self, cfg: RewardConfig, device: str = "cpu"):
        self.weights: dict[str, float] = {}  # every term, in config order
        self.fns: dict[str, Callable[..., float]] = {}  # per-sample terms
        self.batched: dict[str, Callable[[list[str], list], list[float]]] = {}  # class terms: a call per batch
        specs = {}
        for name, term in cfg.terms.items():
            try:
                fn = get_method(term._target_)
            except Exception as e:  # hydra wraps the import error; say which term and path
                raise RewardError(f"reward.terms.{name}._target_={term._target_!r} cannot be imported: "
                                  f"{import_failure(term._target_, e)}") from e
            kwargs = dict(term.kwargs)
            self.weights[name] = term.weight
            if inspect.isclass(fn):
                if "device" in _parameters(fn) and "device" not in kwargs:
                    kwargs["device"] = device
                try:
                    self.batched[name] = fn(**kwargs)
                except Exception as e:
                    raise RewardError(f"reward.terms.{name} ({term._target_}) cannot start: {e}") from e
                continue
            specs[name] = (term._target_, kwargs)
            self.fns[name] = functools.partial(fn, **kwargs)
        self.correct_term = cfg.correct_term
        self.timeout_s = cfg.timeout_s or None
        self.error_value = float(cfg.error_value)
        self.order = cfg.combine
        self.pool = RewardPool(specs, cfg.workers, self.timeout_s) if cfg.workers > 0 and specs else None
        self.errors = 0  # calls that failed (raised, timed out, not finite), over the run

    def _call_here(self, name: str, completion: str, prompt) -> Outcome:
        """One call in this process, under a SIGALRM timer when this is the main thread."""
        return call_with_timeout(lambda: float(self.fns[name](completion, prompt)), self.timeout_s)

    def attach(self, engine, tokenizer) -> None:
        """Give the policy's engine (and its tokenizer) to the batched terms that use it."""
        for term in self.batched.values():
            if hasattr(term, "attach"):
                term.attach(engine, tokenizer)

    def _call_batched(self, name: str, rollouts: list[Rollout]) -> list[Outcome]:
        """One call of a batched term over all `rollouts`, under the timeout; a failure fails every sample."""
        term = self.batched[name]
        values, error = call_with_timeout(lambda: [float(v) for v in term([r.text for r in rollouts],
                                                                          [r.prompt for r in rollouts])],
                                          self.timeout_s and self.timeout_s * max(1, len(rollouts)))
        if error is None and len(values) != len(rollouts):
            error = f"returned {len(values)} scores for {len(rollouts)} completions"
        return [(None, error)] * len(rollouts) if error is not None else [(v, None) for v in values]

    def score(self, rollouts: list[Rollout]) -> int:
        """Fill `rewards`, `reward` and `reward_errors` of each rollout; return how many calls failed."""
        calls: list[Call] = [(name, r.text, r.prompt) for r in rollouts for name in self.fns]
        outcomes = self.pool.run(calls) if self.pool else [self._call_here(*c) for c in calls]
        per_sample = {(i // len(self.fns), name): outcome for i, ((name, _, _), outcome) in
                      enumerate(zip(calls, outcomes, strict=True))}
        for name in self.batched:
            per_sample.update({(k, name): o for k, o in enumerate(self._call_batched(name, rollouts))})
        failed = 0
        for k, name in sorted(per_sample, key=lambda key: (key[0], list(self.weights).index(key[1]))):
            r = rollouts[k]
            value, error = per_sample[k, name]
            if error is None and not math.isfinite(value):
                error = f"returned {value}"
            if error is not None:
                failed += 1
                if failed <= SHOWN_ERRORS:
                    log.warning("reward %r failed (%s; scored %g) on completion %r (answer %r)", name, error,
                                self.error_value, r.text[:200], r.prompt.answer[:100])
                r.reward_errors[name] = error
                value = self.error_value
            r.rewards[name] = value
        for r in rollouts:
            r.reward = sum(self.weights[n] * v for n, v in r.rewards.items())
        if failed > SHOWN_ERRORS:
            log.warning("... %d more reward calls failed in this batch", failed - SHOWN_ERRORS)
        self.errors += failed
        return failed

    def scores(self, rollouts: list[Rollout], group_size: int) -> torch.Tensor:
        """Scores [P, G] for the advantages: the terms combined in `reward.combine`'s order."""
        import torch

        terms = {n: torch.tensor([r.rewards[n] for r in rollouts]).view(-1, group_size) for n in self.weights}
        return combine(terms, self.weights, self.order)

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the count of failed reward calls over the run."""
        return {"errors": self.errors}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.errors = int(state["errors"])

    def is_correct(self, rollout: Rollout) -> bool:
        return rollout.rewards[self.correct_term] >= 1.0

    @property
    def correct_terms(self) -> set[str]:
        """The terms that define accuracy (the monitor watches the others)."""
        return {self.correct_term}

    def close(self) -> None:
        if self.pool:
            self.pool.close()
        for term in self.batched.values():
            if hasattr(term, "close"):
                term.close()


class MixedRewards:
    """A mixture's rewards (rlvr.data.mixture): each source's own terms score its prompts (the source is
    the prompt's `meta["domain"]`), logged as `reward/<source>/<term>`. The same methods as `Rewards`."""

    def __init__(self, sources: dict[str, Rewards]):
        self.sources = sources
        self.weights = {f"{name}/{term}": w for name, r in sources.items() for term, w in r.weights.items()}

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.sources.values())

    @property
    def correct_terms(self) -> set[str]:
        return {f"{name}/{r.correct_term}" for name, r in self.sources.items()}

    def score(self, rollouts: list[Rollout]) -> int:
        """Each source's rollouts scored by its terms, their names prefixed with the source's."""
        failed = 0
        for name, rewards in self.sources.items():
            mine = [r for r in rollouts if r.prompt.meta["domain"] == name]
            if mine:
                failed += rewards.score(mine)
                for r in mine:
                    r.rewards = {f"{name}/{term}": v for term, v in r.rewards.items()}
                    r.reward_errors = {f"{name}/{term}": e for term, e in r.reward_errors.items()}
        return failed

    def scores(self, rollouts: list[Rollout], group_size: int) -> torch.Tensor:
        """Scores [P, G]: each group (one prompt, so one source) combined as its source's terms say."""
        import torch

        rows = []
        for k in range(0, len(rollouts), group_size):
            group = rollouts[k : k + group_size]
            name = group[0].prompt.meta["domain"]
            r = self.sources[name]
            terms = {t: torch.tensor([[x.rewards[f"{name}/{t}"] for x in group]]) for t in r.weights}
            rows.append(combine(terms, r.weights, r.order))
        return torch.cat(rows)

    def is_correct(self, rollout: Rollout) -> bool:
        name = rollout.prompt.meta["domain"]
        return rollout.rewards[f"{name}/{self.sources[name].correct_term}"] >= 1.0

    def attach(self, engine, tokenizer) -> None:
        for r in self.sources.values():
            r.attach(engine, tokenizer)

    def state_dict(self) -> dict:
        return {name: r.state_dict() for name, r in self.sources.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, r in self.sources.items():
            r.load_state_dict(state[name])

    def close(self) -> None:
        for r in self.sources.values():
            r.close()


def build_rewards(cfg, device: str = "cpu") -> Rewards | MixedRewards:
    """The run's rewards: `reward`'s terms, or in a mixture (`data.sources`) each source's own."""
    sources = getattr(cfg.data, "sources", None)
    if not sources:
        return Rewards(cfg.reward, device)
    built: dict[str, Rewards] = {}
    try:
        for name, source in sources.items():
            try:
                built[name] = Rewards(source.reward, device)
            except RewardError as e:
                raise RewardError(f"data.sources.{name}.{e}") from e
    except BaseException:
        for r in built.values():
            r.close()
        raise
    return MixedRewards(built)
