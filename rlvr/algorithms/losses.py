"""Policy losses: the clipped surrogate, KL estimators, and loss aggregation.

Per-token quantities are [N, T] (N sequences, T target positions) with a 0/1 mask of
completion tokens. Aggregation divides by batch-wide constants (`Normaliser`) rather than
by micro-batch sizes, so a step's loss and gradient do not depend on how the batch is
split into micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_old) per token, [N, T], and exactly 0 off the mask.

    Every ratio is formed from this, masked *before* the exponential: off the mask the two
    logprobs can come from different forwards (a prompt position scored in one micro-batch, padded
    with 0 in another), and exp(0 - (-90)) = inf, which a later `* mask` turns into NaN.
    """
    return torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token probability ratio pi / pi_old, [N, T] (PPO, Schulman et al. 2017, Eq. 6); 1 off the mask."""
    return torch.exp(log_ratio(logp, old_logp, mask))


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level ratio (Zheng et al. 2025, arXiv:2507.18071, Eq. 7), the geometric mean of the
    token ratios: s_i = exp(mean_t (logp - old_logp)), broadcast to every token of the sequence, [N, T]."""
    lengths = mask.sum(dim=1).clamp(min=1)  # [N]
    mean_log_ratio = log_ratio(logp, old_logp, mask).sum(dim=1) / lengths  # [N]
    return torch.exp(mean_log_ratio)[:, None].expand_as(logp)


def clipped_surrogate(
    ratio: torch.Tensor,  # [N, T] pi / pi_old (token_ratio or sequence_ratio)
    advantages: torch.Tensor,  # [N]
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped objective (Schulman et al. 2017, Eq. 7), negated as a loss, per token:
    -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A).

    With eps_low != eps_high this is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476, Eq. 10).
    `dual_clip` = c > 1 also bounds the loss of negative advantages by -c * A (Ye et al. 2020,
    arXiv:1912.09729, Eq. 5), so a huge ratio on a bad sample cannot dominate the batch.
    Returns (loss [N, T], clipped [N, T]) where `clipped` marks tokens whose gradient a clip removed.
    """
    adv = advantages[:, None]  # [N, 1]
    unclipped = ratio * adv
    clipped_obj = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped_obj)
    was_clipped = clipped_obj < unclipped
    if dual_clip is not None:
        bound = (-dual_clip * adv).expand_as(loss)
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


def tis_weight(learner_old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
               cap: float) -> torch.Tensor:
    """Truncated importance sampling between the sampler (vLLM) and the learner (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training", Eq. 3):
    min(pi_learner_old / pi_sampler, cap) per token, [N, T], 0 off the mask; a constant (no gradient)."""
    return (token_ratio(learner_old_logp, sampler_logp, mask).clamp(max=cap) * mask).detach()


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13), per completion length [N]:
    0 up to max_tokens - buffer, then falling linearly to -1 at max_tokens (and -1 beyond)."""
    start = max_tokens - buffer
    return ((start - lengths.float()) / buffer).clamp(min=-1.0, max=0.0)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy, [N, T], 0 off the mask
    (Schulman, "Approximating KL divergence", 2020), with log r = ref_logp - logp:
    k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r (GRPO Eq. 4).

    As a reward penalty all three estimate KL(policy || ref) (k1 and k3 unbiased, k3 always >= 0).
    As a loss term their gradients differ: k1's expected gradient is zero (no pull towards the
    reference at all, so `check` refuses it in the loss), k2's is the gradient of KL(policy || ref),
    k3's that of KL(ref || policy).
    """
    log_r = log_ratio(ref_logp, logp, mask)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - 1 - log_r
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
