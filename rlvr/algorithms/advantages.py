"""Group-relative advantage estimators.

Every function takes the rewards of one step as [P, G] (P prompts, G samples each) and
returns advantages of the same shape. A group whose rewards are all equal gets advantage
0 under every estimator: it carries no signal.
"""

from __future__ import annotations

import torch


def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome supervision, Shao et al. 2024 (arXiv:2402.03300), Sec. 4.1.2:
    A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    Uses the unbiased std (torch's default, as in TRL and verl); a zero-variance group gets
    advantage 0 because its numerator is 0.
    """
    mean = rewards.mean(dim=1, keepdim=True)  # [P, 1]
    std = rewards.std(dim=1, keepdim=True)  # [P, 1]
    return (rewards - mean) / (std + eps)


def dr_grpo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Dr. GRPO, Liu et al. 2025 (arXiv:2503.20783), Eq. 3: A_i = r_i - mean(r), no std division."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo(rewards: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """RLOO, Ahmadian et al. 2024 (arXiv:2402.14740): A_i = r_i - mean_{j != i} r_j
    = G / (G - 1) * (r_i - mean(r))."""
    g = rewards.shape[1]
    return (rewards - rewards.mean(dim=1, keepdim=True)) * g / (g - 1)


ESTIMATORS = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def compute(rewards: torch.Tensor, kind: str, eps: float) -> torch.Tensor:
    """Advantages [P, G] of rewards [P, G] under the named estimator."""
    return ESTIMATORS[kind](rewards, eps)
