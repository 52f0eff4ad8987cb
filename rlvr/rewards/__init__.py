"""Verifiable rewards and their weighted combination.

A reward term is any `fn(completion: str, prompt: Prompt, **kwargs) -> float`, named in the
`reward` config by dotted path (`_target_`) with a weight. The total is the weighted sum of
the terms; every term is also logged on its own as `reward/<name>`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from rlvr.errors import RlvrError
from rlvr.types import Rollout

log = logging.getLogger(__name__)


class RewardError(RlvrError, ValueError):
    """A reward term that cannot be loaded; the message names the term."""


class Rewards:
    """The configured reward terms, loaded once at startup."""

    def __init__(self, cfg: DictConfig):
        self.weights: dict[str, float] = {}
        self.fns: dict[str, Callable[..., float]] = {}
        for name, term in cfg.terms.items():
            try:
                fn = get_method(term._target_)
            except Exception as e:  # hydra wraps the import error; say which term and path
                raise RewardError(f"reward.terms.{name}._target_={term._target_!r} cannot be imported: {e}") from e
            self.fns[name] = functools.partial(fn, **OmegaConf.to_container(term.kwargs))
            self.weights[name] = float(term.weight)
        self.correct_term = cfg.correct_term
        self.errors = 0  # calls that raised, over the run

    def score(self, rollouts: list[Rollout]) -> None:
        """Fill `rewards` and `reward` of each rollout. A term that raises scores 0 and is counted."""
        for r in rollouts:
            for name, fn in self.fns.items():
                try:
                    r.rewards[name] = float(fn(r.text, r.prompt))
                except Exception as e:
                    self.errors += 1
                    log.warning("reward %r raised %s: %s (scored 0) on completion %r", name,
                                type(e).__name__, e, r.text[:200])
                    r.rewards[name] = 0.0
            r.reward = sum(self.weights[n] * v for n, v in r.rewards.items())

    def is_correct(self, rollout: Rollout) -> bool:
        return rollout.rewards[self.correct_term] >= 1.0
