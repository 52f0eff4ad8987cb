"""The policy objective (`rlvr.algorithms.objective`) per algorithm preset, against numbers derived by
hand in each test. The presets are read from their YAML, so a preset that changes its clip or its
aggregation changes these numbers."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.losses import Normaliser
from rlvr.algorithms.objective import PolicyLossConfig, policy_loss, sft_loss
from tests.conftest import compose_config

LN = math.log


def preset(name: str, *overrides: str) -> PolicyLossConfig:
    return PolicyLossConfig.of(compose_config(["model=tiny", f"algorithm={name}", *overrides]).algorithm)


# Two sequences of two target positions; the second sequence's last position is padding.
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
OLD = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
# New probabilities 0.75 and 0.5 (ratios 1.5 and 1.0) on sequence 0, 0.25 (ratio 0.5) on sequence 1;
# the padded position holds a value that must not matter.
NEW = torch.log(torch.tensor([[0.75, 0.5], [0.25, 0.9]]))
ADV = torch.tensor([1.0, -1.0])
NORM = Normaliser(tokens=3, sequences=2, max_tokens=4)


def test_grpo_clips_the_ratio_at_one_fifth_and_takes_a_token_mean():
    # seq 0, A = +1: ratio 1.5 clipped to 1.2 -> -1.2 (clipped); ratio 1.0 -> -1.0
    # seq 1, A = -1: ratio 0.5 -> -min(0.5 * -1, clip(0.5) * -1) = -min(-0.5, -0.8) = 0.8 (clipped)
    # token mean over the batch's 3 tokens: (-1.2 - 1.0 + 0.8) / 3 = -0.4667
    loss, stats = policy_loss(NEW, OLD, None, ADV, MASK, preset("grpo"), NORM)
    assert float(loss) == pytest.approx(-1.4 / 3)
    assert stats.clipped == 2 and stats.tokens == 3 and stats.kl == 0


def test_dapo_clips_higher_at_0_28():
    # seq 0: ratio 1.5 clipped to 1.28 -> -1.28; -1.0.  seq 1: clip low still 0.8 -> 0.8
    loss, _ = policy_loss(NEW, OLD, None, ADV, MASK, preset("dapo"), NORM)
    assert float(loss) == pytest.approx((-1.28 - 1.0 + 0.8) / 3)


def test_dr_grpo_divides_by_sequences_times_max_tokens():
    # the per-token losses of GRPO summed, (-1.2 - 1.0 + 0.8) = -1.4, over 2 sequences * 4 max tokens
    loss, _ = policy_loss(NEW, OLD, None, ADV, MASK, preset("dr_grpo"), NORM)
    assert float(loss) == pytest.approx(-1.4 / 8)


def test_grpo_per_sequence_mean_then_mean_over_sequences():
    # seq 0: (-1.2 - 1.0) / 2 = -1.1; seq 1: 0.8 / 1; mean over 2 sequences: -0.15
    loss, _ = policy_loss(NEW, OLD, None, ADV, MASK, preset("grpo", "algorithm.loss_agg=seq_mean_token_mean"), NORM)
    assert float(loss) == pytest.approx(-0.15)


def test_gspo_one_geometric_mean_ratio_per_sequence_clipped_tightly():
    # seq 0: exp(mean(ln 1.5, ln 1.0)) = sqrt(1.5) = 1.2247, far above 1 + 4e-4: clipped, -(1.0004) per token,
    #   sequence mean -1.0004; seq 1: ratio 0.5 below 1 - 3e-4, A = -1: loss 0.9997, clipped.
    # seq_mean_token_mean over 2 sequences: (-1.0004 + 0.9997) / 2
    loss, stats = policy_loss(NEW, OLD, None, ADV, MASK, preset("gspo"), NORM)
    assert float(loss) == pytest.approx((-1.0004 + 0.9997) / 2, abs=1e-7)
    assert stats.clipped == 3


def test_dual_clip_bounds_the_loss_of_a_negative_advantage():
    # seq 1 with ratio 4 (p 0.5 -> 2.0 is impossible; take old p 0.1, new p 0.4): A = -1, PPO's loss
    # -min(-4, -1.2) = 4, dual clip c = 3 bounds it at 3. Only that token is in the mask.
    new, old = torch.log(torch.tensor([[0.4]])), torch.log(torch.tensor([[0.1]]))
    cfg = preset("grpo", "algorithm.dual_clip=3.0")
    loss, stats = policy_loss(new, old, None, torch.tensor([-1.0]), torch.ones(1, 1), cfg, Normaliser(1, 1, 1))
    assert float(loss) == pytest.approx(3.0) and stats.clipped == 1


def test_tis_weights_scale_each_token_s_surrogate():
    # GRPO's per-token losses (-1.2, -1.0, 0.8) weighted (2, 0.5, 1): (-2.4 - 0.5 + 0.8) / 3 = -0.7
    weight = torch.tensor([[2.0, 0.5], [1.0, 0.0]])
    loss, _ = policy_loss(NEW, OLD, None, ADV, MASK, preset("grpo"), NORM, weight)
    assert float(loss) == pytest.approx(-2.1 / 3)


def test_kl_term_adds_coef_times_k3_per_token():
    # reference = old policy. k3 = r - 1 - ln r with r = p_ref / p: seq 0 token 0: r = 2/3 -> 0.07213;
    # token 1: r = 1 -> 0; seq 1: r = 2 -> 1 - ln 2 = 0.30685. Sum 0.37898; coef 0.1 adds 0.037898 / 3.
    cfg = preset("grpo", "algorithm.kl.coef=0.1")
    loss, stats = policy_loss(NEW, OLD, OLD, ADV, MASK, cfg, NORM)
    k3 = (2 / 3 - 1 - LN(2 / 3)) + (1 - LN(2))
    assert stats.kl == pytest.approx(k3, rel=1e-5)
    assert float(loss) == pytest.approx((-1.4 + 0.1 * k3) / 3, rel=1e-5)


def test_the_surrogate_s_gradient_is_the_advantage_where_unclipped():
    # ratio 1 everywhere (new = old): d(loss)/d(logp) = -A * ratio / tokens = -A / 3 on each masked token
    new = OLD.clone().requires_grad_(True)
    loss, _ = policy_loss(new, OLD, None, ADV, MASK, preset("grpo"), NORM)
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0])


def test_micro_batch_losses_add_up_to_the_batch_loss():
    # each micro-batch divides by the whole batch's counts: the two halves sum to the whole
    cfg = preset("grpo")
    whole, _ = policy_loss(NEW, OLD, None, ADV, MASK, cfg, NORM)
    halves = [policy_loss(NEW[i : i + 1], OLD[i : i + 1], None, ADV[i : i + 1], MASK[i : i + 1], cfg, NORM)[0]
              for i in range(2)]
    assert float(sum(halves)) == pytest.approx(float(whole))


def test_sft_loss_is_the_token_mean_negative_log_likelihood():
    # masked tokens of probability 0.75, 0.5, 0.25: (ln(4/3) + ln 2 + ln 4) / 3; the padded 0.9 is ignored
    loss, stats = sft_loss(NEW, MASK, NORM)
    assert float(loss) == pytest.approx((LN(4 / 3) + LN(2) + LN(4)) / 3)
    assert stats.tokens == 3


def test_doctests():
    import doctest

    from rlvr.algorithms import objective

    result = doctest.testmod(objective)
    assert result.attempted >= 2 and result.failed == 0
