"""The policy objectives as pure functions: per-token logprobs in, the loss a (micro-)batch adds to
the step's loss out, with the counts the step logs. The learner only splits a batch into
micro-batches, runs the forwards, calls one of these and steps the optimizer.

- `policy_loss`: the clipped surrogate of GRPO and its descendants (PPO's clip, DAPO's clip-higher,
  dual clip, GSPO's sequence ratio, TIS weights, a KL term to a reference), aggregated as configured.
- `sft_loss`: the supervised (cold start) objective, the negative log-likelihood of the masked tokens.

Both divide by batch-wide counts (`Normaliser`), so summing the losses of a batch's micro-batches
gives the loss of the whole batch, however it was split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algorithms.losses import (
    Normaliser,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    sequence_ratio,
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
    """Sums over the tokens of the mask, to be added up over micro-batches and divided once."""

    loss: float  # this part's share of the batch loss (already divided by the batch-wide counts)
    kl: float  # sum of the per-token KL estimate (0 without a reference)
    clipped: float  # tokens whose gradient a clip removed
    tokens: float  # tokens in the mask


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
