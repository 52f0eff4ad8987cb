"""Group-relative advantage estimators.

Every function takes the rewards of one step as [P, G] (P prompts, G samples each) and
returns advantages of the same shape. A group whose rewards are all equal gets advantage
exactly 0 under every estimator: it carries no signal. "Equal" allows for float rounding
(`flat_groups`): the mean of eight copies of 1.2 is not 1.2 in float32, and GRPO's std
division would turn that rounding (~1e-8) into an advantage of ~0.1.
"""

from __future__ import annotations

import torch

# Groups whose spread is at most this share of their largest |reward| count as flat.
FLAT_RTOL = 1e-6


def flat_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[P] True where a group's rewards [P, G] are all equal, up to float rounding relative to their scale.
    A group holding a NaN or inf is never flat: its advantages stay non-finite and the update is skipped.

    >>> flat_groups(torch.tensor([[1.2] * 8, [0.2, 1.2] * 4, [0.0] * 8, [float("inf")] * 8])).tolist()
    [True, False, True, False]
    """
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values  # [P]
    return (spread <= FLAT_RTOL * rewards.abs().max(dim=1).values) & spread.isfinite()


def _zero_flat(rewards: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    return torch.where(flat_groups(rewards)[:, None], torch.zeros_like(adv), adv)


def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome supervision, Shao et al. 2024 (arXiv:2402.03300), Sec. 4.1.2:
    A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    Uses the unbiased std (torch's default, as in TRL and verl); a flat group gets advantage 0.
    """
    mean = rewards.mean(dim=1, keepdim=True)  # [P, 1]
    std = rewards.std(dim=1, keepdim=True)  # [P, 1]
    return _zero_flat(rewards, (rewards - mean) / (std + eps))


def dr_grpo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Dr. GRPO, Liu et al. 2025 (arXiv:2503.20783), Eq. 3: A_i = r_i - mean(r), no std division."""
    return _zero_flat(rewards, rewards - rewards.mean(dim=1, keepdim=True))


def rloo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """RLOO, Ahmadian et al. 2024 (arXiv:2402.14740): A_i = r_i - mean_{j != i} r_j
    = G / (G - 1) * (r_i - mean(r))."""
    g = rewards.shape[1]
    return _zero_flat(rewards, (rewards - rewards.mean(dim=1, keepdim=True)) * g / (g - 1))


ESTIMATORS = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def compute(rewards: torch.Tensor, kind: str, eps: float) -> torch.Tensor:
    """Advantages [P, G] of rewards [P, G] under the named estimator."""
    return ESTIMATORS[kind](rewards, eps)
