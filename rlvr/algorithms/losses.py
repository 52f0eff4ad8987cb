"""Policy losses: the clipped surrogate, KL estimators, and loss aggregation.

Per-token quantities are [N, T] (N sequences, T target positions) with a 0/1 mask of
completion tokens. Aggregation divides by batch-wide constants (`Normaliser`) rather than
by micro-batch sizes, so a step's loss and gradient do not depend on how the batch is
split into micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def clipped_surrogate(
    logp: torch.Tensor,  # [N, T] learner logprobs of the sampled tokens
    old_logp: torch.Tensor,  # [N, T] logprobs of the policy that sampled them
    advantages: torch.Tensor,  # [N]
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped objective (Schulman et al. 2017, Eq. 7), negated as a loss, per token:
    -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A).

    With eps_low != eps_high this is DAPO's clip-higher (Yu et al. 2025, Eq. 10).
    Returns (loss [N, T], clipped [N, T]) where `clipped` marks tokens whose gradient the
    clip removed.
    """
    ratio = torch.exp(logp - old_logp)  # [N, T]
    adv = advantages[:, None]  # [N, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy
    (Schulman, "Approximating KL divergence", 2020), with log r = ref_logp - logp:
    k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (unbiased, always >= 0; GRPO Eq. 4).
    """
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(log_ratio) - 1 - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3")


@dataclass(frozen=True)
class Normaliser:
    """Batch-wide counts that aggregation divides by, taken before micro-batching."""

    tokens: int  # completion tokens in the whole batch
    sequences: int  # sequences in the whole batch
    max_tokens: int  # rollout.max_tokens (Dr. GRPO's constant)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normaliser) -> torch.Tensor:
    """Reduce a per-token loss [N, T] of (part of) a batch to this part's share of the batch loss.

    - token_mean: sum over all tokens / tokens in the batch (DAPO, Yu et al. 2025, Eq. 12).
    - seq_mean_token_mean: mean over sequences of each sequence's token mean (GRPO, Eq. 3).
    - token_sum_norm: sum over all tokens / (sequences * max_tokens) (Dr. GRPO, Liu et al. 2025).
    Summing the shares of all micro-batches gives the loss of the whole batch.
    """
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / max(norm.tokens, 1)
    if mode == "seq_mean_token_mean":
        lengths = mask.sum(dim=1).clamp(min=1)  # [N]
        return (masked.sum(dim=1) / lengths).sum() / norm.sequences
    if mode == "token_sum_norm":
        return masked.sum() / (norm.sequences * norm.max_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}")
