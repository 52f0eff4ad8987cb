"""The objectives of every stage as pure functions: per-token logprobs in, the loss a (micro-)batch adds
to the step's loss out, with the counts the step logs. The learner only splits a batch into
micro-batches, runs the forwards, calls one of these and steps the optimizer (`Learner.step(batch,
objective)`, one update path for every stage).

- `policy_loss`: the clipped surrogate of GRPO and its descendants (PPO's clip, DAPO's clip-higher,
  dual clip, GSPO's sequence ratio, TIS weights, a KL term to a reference), aggregated as configured.
- `sft_loss`: the supervised (cold start) objective, the negative log-likelihood of the masked tokens.
- `preference_loss`: DPO's (Rafailov et al. 2023) and SimPO's (Meng et al. 2024) pairwise losses, on
  rows that come in pairs: chosen, then rejected.

Each divides by batch-wide counts (`Normaliser`), so summing the losses of a batch's micro-batches
gives the loss of the whole batch, however it was split. `RL`, `SFT` and `Preference` are what the
learner's step is given: one of these losses with what it asks of the step (which rows it runs, a
reference's logprobs, epochs and mini-batches) and the metrics it logs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

import torch
import torch.nn.functional as F

from rlvr.algorithms.losses import (
    Normaliser,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    sequence_ratio,
    tis_weight,
    token_ratio,
)


@dataclass(frozen=True)
class PolicyLossConfig:
    """What `policy_loss` needs of `algorithm.*` (its YAML comments say what each does)."""

    ratio: str = "token"  # token | sequence (GSPO)
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean | token_sum_norm
    kl_coef: float = 0.0  # weight of the KL term in the loss (0: none)
    kl_estimator: str = "k3"

    @classmethod
    def of(cls, algorithm) -> PolicyLossConfig:
        """The objective's part of an `algorithm` config."""
        a = algorithm
        return cls(a.ratio, a.clip_eps_low, a.clip_eps_high, a.dual_clip, a.loss_agg, a.kl.coef, a.kl.estimator)


@dataclass
class LossStats:
    """Sums over the tokens (or pairs) of a part, to be added up over micro-batches and divided once;
    each objective fills its own."""

    loss: float  # this part's share of the batch loss (already divided by the batch-wide counts)
    kl: float = 0.0  # sum of the per-token KL estimate (0 without a reference)
    clipped: float = 0.0  # tokens whose gradient a clip removed
    tokens: float = 0.0  # tokens in the mask
    mismatch_sum: float = 0.0  # |learner - sampler| logprob summed over the mask (RL)
    mismatch_max: float = 0.0  # and its largest value (the one field added up by max)
    pairs: float = 0.0  # preference pairs
    ordered: float = 0.0  # pairs whose chosen answer's implicit reward is above the rejected one's
    margin: float = 0.0  # sum of (chosen - rejected) implicit rewards
    chosen: float = 0.0  # sum of the chosen answers' implicit rewards
    rejected: float = 0.0  # and of the rejected ones'

    def add(self, other: LossStats) -> None:
        """Add `other`'s sums into these (the largest mismatch kept)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(mine, theirs) if f.name == "mismatch_max" else mine + theirs)


def policy_loss(
    logprobs: torch.Tensor,  # [N, T] under the policy being trained (with gradient)
    old: torch.Tensor,  # [N, T] under the policy that the ratio is taken against (no gradient)
    ref: torch.Tensor | None,  # [N, T] under the KL reference, or None for no KL term
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, T] 1 on the tokens the loss counts
    config: PolicyLossConfig,
    norm: Normaliser,
    weight: torch.Tensor | None = None,  # [N, T] per-token weights (TIS), constants
) -> tuple[torch.Tensor, LossStats]:
    """The clipped surrogate (optionally TIS-weighted, plus `kl_coef` * KL to `ref`), aggregated
    by `config.loss_agg` over `norm`: (loss, stats).

    >>> lp = torch.tensor([[0.0, 0.0]]); mask = torch.tensor([[1.0, 1.0]])
    >>> loss, stats = policy_loss(lp, lp, None, torch.tensor([2.0]), mask, PolicyLossConfig(), Normaliser(2, 1, 4))
    >>> float(loss), stats.clipped  # ratio 1 on both tokens: -(1 * 2) per token, token mean
    (-2.0, 0.0)
    """
    if config.ratio == "sequence":
        ratio = sequence_ratio(logprobs, old, mask)
    else:
        ratio = token_ratio(logprobs, old, mask)
    per_token, was_clipped = clipped_surrogate(ratio, advantages, config.clip_eps_low, config.clip_eps_high,
                                               config.dual_clip)  # [N, T]
    if weight is not None:
        per_token = per_token * weight
    kl_sum = 0.0
    if ref is not None:
        kl = kl_penalty(logprobs, ref, mask, config.kl_estimator)  # [N, T]
        per_token = per_token + config.kl_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    loss = aggregate(per_token, mask, config.loss_agg, norm)
    return loss, LossStats(float(loss.detach()), kl_sum, float((was_clipped * mask).sum()), float(mask.sum()))


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> tuple[torch.Tensor, LossStats]:
    """Supervised next-token loss: the negative log-likelihood of the masked tokens [N, T] (the
    assistant's own), divided by the tokens of the whole batch (a token mean over the batch).

    >>> lp = torch.log(torch.tensor([[0.5, 0.25, 1.0]])); mask = torch.tensor([[1.0, 1.0, 0.0]])
    >>> round(float(sft_loss(lp, mask, Normaliser(2, 1, 3))[0]), 4)  # (ln 2 + ln 4) / 2
    1.0397
    """
    loss = -(logprobs * mask).sum() / max(norm.tokens, 1)
    return loss, LossStats(float(loss.detach()), 0.0, 0.0, float(mask.sum()))


@dataclass(frozen=True)
class PreferenceConfig:
    """What `preference_loss` needs of `dpo.*` (its YAML comments say what each does)."""

    loss: str = "dpo"  # dpo | simpo
    beta: float = 0.1
    simpo_gamma: float = 0.5  # SimPO's target margin (its gamma), in the units of beta * mean logprob


def preference_loss(
    logprobs: torch.Tensor,  # [2P, T] under the policy (with gradient); rows 2k chosen, 2k+1 rejected
    mask: torch.Tensor,  # [2P, T] 1 on each answer's own tokens
    ref: torch.Tensor | None,  # [2P, T] under the frozen reference (DPO), None for SimPO
    config: PreferenceConfig,
    norm: Normaliser,  # norm.sequences: rows (two per pair) of the whole batch
) -> tuple[torch.Tensor, LossStats]:
    """The pairwise loss, summed over this part's pairs and divided by the whole batch's pairs.

    - dpo: -log sigmoid(r_c - r_r) with the implicit reward r = beta * (log pi(y|x) - log pi_ref(y|x)),
      summed over the answer's tokens (Rafailov et al. 2023, arXiv:2305.18290, Eq. 7).
    - simpo: -log sigmoid(r_c - r_r - gamma) with r = beta * the answer's mean token logprob, no
      reference (Meng et al. 2024, arXiv:2405.14734, Eq. 6).

    >>> lp = torch.log(torch.tensor([[0.5], [0.25]])); mask = torch.ones(2, 1)
    >>> loss, stats = preference_loss(lp, mask, lp, PreferenceConfig("dpo", 0.1), Normaliser(2, 2, 1))
    >>> round(float(loss), 4), stats.margin  # at the reference both rewards are 0: -log sigmoid(0) = ln 2
    (0.6931, 0.0)
    """
    seq = (logprobs * mask).sum(dim=1)  # [2P]
    if config.loss == "dpo":
        if ref is None:
            raise ValueError("dpo needs the reference's logprobs")
        reward = config.beta * (seq - (ref * mask).sum(dim=1))  # [2P]
        offset = 0.0
    elif config.loss == "simpo":
        reward = config.beta * seq / mask.sum(dim=1).clamp(min=1)  # [2P]
        offset = config.simpo_gamma
    else:
        raise ValueError(f"unknown preference loss {config.loss!r}; use dpo or simpo")
    chosen, rejected = reward[0::2], reward[1::2]  # [P]
    margin = chosen - rejected  # [P]
    loss = -F.logsigmoid(margin - offset).sum() / max(norm.sequences // 2, 1)
    m = margin.detach()
    return loss, LossStats(float(loss.detach()), tokens=float(mask.sum()), pairs=float(len(m)),
                           ordered=float((m > 0).sum()), margin=float(m.sum()), chosen=float(chosen.detach().sum()),
                           rejected=float(rejected.detach().sum()))


@dataclass(frozen=True)
class Fixed:
    """What an update holds constant over its micro-batches, [n, t] each, taken before its first step."""

    sampler: torch.Tensor  # the sampler's logprobs (Batch.old_logprobs; 0 for what no engine sampled)
    old: torch.Tensor | None  # the old policy's logprobs; None: each forward's own, detached (with TIS)
    weight: torch.Tensor | None  # TIS weights, or None
    ref: torch.Tensor | None  # the frozen reference's logprobs, or None

    def select(self, rows: torch.Tensor, width: int, device) -> Fixed:
        """These rows' tensors up to position `width - 1`, on `device` (what one forward scored)."""
        def cut(x):
            return None if x is None else x[rows, : width - 1].to(device)

        return Fixed(cut(self.sampler), cut(self.old), cut(self.weight), cut(self.ref))

    def take(self, rows: torch.Tensor | slice) -> Fixed:
        """These rows of a batch's tensors (a mini-batch)."""
        def cut(x):
            return None if x is None else x[rows]

        return Fixed(cut(self.sampler), cut(self.old), cut(self.weight), cut(self.ref))


class Objective(Protocol):
    """What `Learner.step` is given: the loss of a micro-batch and what it asks of the step."""

    tis_cap: float | None  # the old policy is the learner's own before the update, with TIS at this cap
    epochs: int  # passes over the batch
    mini_batches: int  # optimizer steps per pass
    pair: int  # rows that must share a micro-batch (2: a preference pair)

    @property
    def reference(self) -> bool:  # whether the loss needs the frozen reference's logprobs
        ...

    def rows(self, batch) -> torch.Tensor:  # the rows whose forward can move the loss
        ...

    def loss(self, logp: torch.Tensor, mask: torch.Tensor, part, fixed: Fixed,
             norm: Normaliser) -> tuple[torch.Tensor, LossStats]:  # a micro-batch's share of the loss
        ...

    def metrics(self, updates: list[LossStats]) -> dict:  # the step's record of its own figures
        ...


@dataclass(frozen=True)
class RL:
    """RL's objective for `Learner.step`: the clipped surrogate (`policy_loss`) over `epochs` passes
    of `mini_batches` optimizer steps, each on the rows whose advantage is not zero (with a KL term: all;
    a row of advantage 0 adds exactly 0 to the surrogate's gradient). With `tis_cap` the old policy is
    the learner's own before the update, each token weighted by TIS against the sampler."""

    config: PolicyLossConfig
    tis_cap: float | None
    epochs: int = 1
    mini_batches: int = 1
    pair: int = 1  # rows that must share a micro-batch

    @property
    def reference(self) -> bool:
        return self.config.kl_coef > 0

    def rows(self, batch) -> torch.Tensor:
        every = torch.arange(len(batch))
        return every if self.reference else every[batch.advantages != 0]

    def loss(self, logp: torch.Tensor, mask: torch.Tensor, part, fixed: Fixed,
             norm: Normaliser) -> tuple[torch.Tensor, LossStats]:
        sampler = fixed.sampler  # [n, t]
        if fixed.old is None:  # the learner's own old logprobs: these, before the step (no gradient)
            old = logp.detach()
            weight = tis_weight(old, sampler, mask, self.tis_cap)
        else:
            old, weight = fixed.old, fixed.weight
        loss, stats = policy_loss(logp, old, fixed.ref, part.advantages.to(logp.device), mask, self.config, norm,
                                  weight)
        stats.kl = stats.kl / max(norm.tokens, 1)
        gap = (logp.detach() - sampler).abs() * mask
        stats.mismatch_sum = float(gap.sum())
        stats.mismatch_max = float(gap.max()) if gap.numel() else 0.0
        return loss, stats

    def metrics(self, updates: list[LossStats]) -> dict[str, float | None]:
        """The step's record of the surrogate: mean KL, the share of tokens a clip removed, and the
        engine/learner mismatch measured on the first update, before any step."""
        out: dict[str, float | None] = {
            "kl": None if not self.reference else sum(s.kl for s in updates) / len(updates),
            "clip_frac": sum(s.clipped for s in updates) / max(sum(s.tokens for s in updates), 1.0)}
        first = updates[0]
        if first.tokens:
            out["mismatch/logprob_abs_mean"] = first.mismatch_sum / first.tokens
            out["mismatch/logprob_abs_max"] = first.mismatch_max
            out["mismatch/tokens"] = first.tokens
        return out


@dataclass(frozen=True)
class SFT:
    """The cold start's objective for `Learner.step`: `sft_loss` on every row, one optimizer step."""

    tis_cap: None = None
    epochs: int = 1
    mini_batches: int = 1
    pair: int = 1
    reference: bool = False

    def rows(self, batch) -> torch.Tensor:
        return torch.arange(len(batch))

    def loss(self, logp, mask, part, fixed: Fixed, norm: Normaliser) -> tuple[torch.Tensor, LossStats]:
        return sft_loss(logp, mask, norm)

    def metrics(self, updates: list[LossStats]) -> dict[str, float]:
        return {"learn/target_tokens": sum(s.tokens for s in updates)}


@dataclass(frozen=True)
class Preference:
    """A preference stage's objective for `Learner.step`: `preference_loss` on rows in pairs (chosen,
    rejected; a pair never split across micro-batches), one optimizer step; DPO takes the frozen
    reference's logprobs (the stage's starting model)."""

    config: PreferenceConfig
    tis_cap: None = None
    epochs: int = 1
    mini_batches: int = 1
    pair: int = 2

    @property
    def reference(self) -> bool:
        return self.config.loss == "dpo"

    def rows(self, batch) -> torch.Tensor:
        return torch.arange(len(batch))

    def loss(self, logp, mask, part, fixed: Fixed, norm: Normaliser) -> tuple[torch.Tensor, LossStats]:
        return preference_loss(logp, mask, fixed.ref, self.config, norm)

    def metrics(self, updates: list[LossStats]) -> dict[str, float]:
        """pref/accuracy: the share of pairs whose chosen answer the policy prefers more than the
        reference does (SimPO: more than the rejected one by any margin); pref/margin and the mean
        implicit rewards."""
        pairs = max(sum(s.pairs for s in updates), 1.0)
        return {"pref/accuracy": sum(s.ordered for s in updates) / pairs,
                "pref/margin": sum(s.margin for s in updates) / pairs,
                "pref/chosen_reward": sum(s.chosen for s in updates) / pairs,
                "pref/rejected_reward": sum(s.rejected for s in updates) / pairs}
