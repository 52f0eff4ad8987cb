"""GRPO-family pure functions against numbers derived by hand in each test."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms import advantages
from rlvr.algorithms.losses import (
    Normaliser,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    overlong_penalty,
    sequence_ratio,
    tis_weight,
    token_ratio,
)


def test_grpo_advantages_of_a_half_right_group_are_plus_minus_one():
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    adv = advantages.grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    expected = 0.5 / math.sqrt(1 / 3)  # 0.866
    assert adv.tolist()[0] == pytest.approx([expected, -expected, -expected, expected])


def test_grpo_zero_variance_group_has_zero_advantage():
    adv = advantages.grpo(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), eps=1e-6)
    assert adv.abs().max().item() == 0.0


def test_dr_grpo_subtracts_the_mean_only():
    adv = advantages.dr_grpo(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert adv.tolist()[0] == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_rloo_is_reward_minus_mean_of_the_others():
    # r = [3, 1, 2]: others' means 1.5, 2.5, 2 -> [1.5, -1.5, 0]
    adv = advantages.rloo(torch.tensor([[3.0, 1.0, 2.0]]))
    assert adv.tolist()[0] == pytest.approx([1.5, -1.5, 0.0])


def test_clipped_surrogate_by_hand():
    # log ratio 1 -> ratio e; A = +1: clipped to 1 + 0.2 = 1.2, loss -1.2, clipped.
    # log ratio 1, A = -1: min(-e, -1.2) = -e, loss e, not clipped (pessimistic bound keeps e).
    # log ratio -1 -> ratio 1/e = 0.368; A = -1: clip to 0.8 -> min(-0.368, -0.8) = -0.8, loss 0.8, clipped.
    # log ratio 0, A = 2: ratio 1, loss -2.
    logp = torch.tensor([[1.0], [1.0], [-1.0], [0.0]])
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss, clipped = clipped_surrogate(token_ratio(logp, old, torch.ones(4, 1)), adv, eps_low=0.2, eps_high=0.2)
    assert loss.flatten().tolist() == pytest.approx([-1.2, math.e, 0.8, -2.0])
    assert clipped.flatten().tolist() == [True, False, True, False]


def test_clip_higher_only_moves_the_upper_bound():
    # ratio e with A = +1: eps_high 0.28 -> 1.28; ratio 1/e with A = -1: eps_low 0.2 -> 0.8
    ratio = token_ratio(torch.tensor([[1.0], [-1.0]]), torch.zeros(2, 1), torch.ones(2, 1))
    loss, _ = clipped_surrogate(ratio, torch.tensor([1.0, -1.0]), eps_low=0.2, eps_high=0.28)
    assert loss.flatten().tolist() == pytest.approx([-1.28, 0.8])


def test_kl_estimators_by_hand():
    logp, ref, mask = torch.tensor([0.0, -1.0, -1.0]), torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    # log r = ref - logp = [0, 1, (masked)]
    assert kl_penalty(logp, ref, mask, "k1").tolist() == pytest.approx([0.0, -1.0, 0.0])
    assert kl_penalty(logp, ref, mask, "k2").tolist() == pytest.approx([0.0, 0.5, 0.0])
    assert kl_penalty(logp, ref, mask, "k3").tolist() == pytest.approx([0.0, math.e - 2, 0.0])


def test_aggregation_modes_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = Normaliser(tokens=4, sequences=2, max_tokens=5)
    assert aggregate(per_token, mask, "token_mean", norm).item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq_mean_token_mean", norm).item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "token_sum_norm", norm).item() == pytest.approx(10 / (2 * 5))


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "token_sum_norm"])
def test_aggregation_does_not_depend_on_micro_batching(mode):
    torch.manual_seed(0)
    logp = torch.randn(6, 5, requires_grad=True)
    old = torch.randn(6, 5)
    adv = torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).float()
    norm = Normaliser(tokens=int(mask.sum()), sequences=6, max_tokens=5)

    def loss_of(rows):
        per_token, _ = clipped_surrogate(token_ratio(logp[rows], old[rows], mask[rows]), adv[rows], 0.2, 0.28)
        return aggregate(per_token, mask[rows], mode, norm)

    whole = loss_of(slice(0, 6))
    (grad_whole,) = torch.autograd.grad(whole, logp)
    parts = [loss_of(slice(0, 2)), loss_of(slice(2, 5)), loss_of(slice(5, 6))]
    (grad_parts,) = torch.autograd.grad(sum(parts), logp)
    assert sum(parts).item() == pytest.approx(whole.item(), abs=1e-6)
    assert torch.allclose(grad_parts, grad_whole, atol=1e-7)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # ratio 10, A = -1: PPO's loss is max(10, 1.2) = 10; dual clip c = 3 bounds it by 3.
    # ratio 10, A = +1: clipped to 1.2 -> loss -1.2, dual clip does not apply to A > 0.
    # ratio 2, A = -1: loss 2 < 3, untouched.
    ratio = torch.tensor([[10.0], [10.0], [2.0]])
    loss, clipped = clipped_surrogate(ratio, torch.tensor([-1.0, 1.0, -1.0]), 0.2, 0.2, dual_clip=3.0)
    assert loss.flatten().tolist() == pytest.approx([3.0, -1.2, 2.0])
    assert clipped.flatten().tolist() == [True, True, False]


def test_gspo_sequence_ratio_is_the_geometric_mean_over_the_sequence():
    # log ratios [1, 0, -0.5 (masked out)] -> mean over the 2 real tokens 0.5 -> ratio e^0.5 on every token
    logp = torch.tensor([[1.0, 0.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ratio = sequence_ratio(logp, torch.zeros(1, 3), mask)
    assert ratio.flatten().tolist() == pytest.approx([math.exp(0.5)] * 3)
    # and one loss per sequence: clipped at 1 + 4e-4 for A = 1
    loss, _ = clipped_surrogate(ratio, torch.tensor([1.0]), 3e-4, 4e-4)
    norm = Normaliser(tokens=2, sequences=1, max_tokens=3)
    assert aggregate(loss, mask, "seq_mean_token_mean", norm).item() == pytest.approx(-1.0004)


def test_tis_weight_is_the_capped_ratio_of_learner_to_sampler():
    # learner - sampler logprob: [ln 0.5, ln 3, 0, (masked)] -> weights [0.5, min(3, 2) = 2, 1, 0]
    w = tis_weight(torch.tensor([math.log(0.5), math.log(3.0), 0.0, 5.0]), torch.zeros(4),
                   torch.tensor([1.0, 1.0, 1.0, 0.0]), cap=2.0)
    assert w.tolist() == pytest.approx([0.5, 2.0, 1.0, 0.0])


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
@pytest.mark.parametrize("reward", [1.2, 0.2, 0.6, 1 / 3, -7.1, 1e6 + 0.1])
def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(estimator, group_size, reward):
    # float32 means of G copies of 1.2 are not 1.2 (at G = 8: 1.2000000477 vs 1.2000000477 + 1 ulp), and
    # GRPO's std division would blow the ~1e-8 rounding up to an advantage of ~0.1.
    scores = torch.tensor([[reward] * group_size, [0.0, 1.0] * (group_size // 2)])
    adv = advantages.compute(scores, estimator, eps=1e-6)
    assert adv[0].tolist() == [0.0] * group_size
    assert adv[1].abs().min().item() > 0.1  # a group with a signal keeps it


def test_a_group_of_non_finite_scores_is_not_flat():
    # NaN/inf must reach the learner (which skips the update), not be zeroed as "no signal".
    scores = torch.tensor([[float("inf")] * 4, [float("nan"), 1.0, 1.0, 1.0]])
    assert not advantages.compute(scores, "grpo", 1e-6).isfinite().any()


def test_combining_normalised_terms_keeps_a_flat_term_at_zero():
    from rlvr.rewards import combine

    terms = {"flat": torch.full((1, 8), 0.2), "signal": torch.tensor([[0.0, 1.0] * 4])}
    only_flat = combine({"flat": terms["flat"]}, {"flat": 1.0}, "normalise_then_sum")
    assert only_flat.tolist() == [[0.0] * 8]
    both = combine(terms, {"flat": 1.0, "signal": 1.0}, "normalise_then_sum")
    assert both.tolist() == combine({"signal": terms["signal"]}, {"signal": 1.0}, "normalise_then_sum").tolist()


def test_ratios_of_masked_positions_stay_finite():
    # A prompt position scored in one micro-batch (logprob -100) and padded with 0 in another: exp(100)
    # overflows float32, and inf * 0 (the mask) is NaN. Every ratio is masked before its exponential.
    logp = torch.tensor([[0.0, -0.5, -0.2]], requires_grad=True)
    old = torch.tensor([[-100.0, -0.4, -0.2]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    for ratio in (token_ratio(logp, old, mask), sequence_ratio(logp, old, mask)):
        loss, _ = clipped_surrogate(ratio, torch.tensor([1.0]), 0.2, 0.2)
        total = aggregate(loss, mask, "seq_mean_token_mean", Normaliser(tokens=2, sequences=1, max_tokens=3))
        (grad,) = torch.autograd.grad(total, logp)
        assert total.isfinite() and grad.isfinite().all() and grad[0, 0] == 0
    assert tis_weight(old, logp.detach(), mask, cap=2.0).isfinite().all()
    for estimator in ("k1", "k2", "k3"):
        kl = kl_penalty(logp, old, mask, estimator)
        assert kl.isfinite().all() and kl[0, 0] == 0


def test_soft_overlong_punishment_by_hand():
    # max_tokens 20, buffer 4: free up to 16, then -1/4 per token, -1 at 20
    penalty = overlong_penalty(torch.tensor([10, 16, 17, 19, 20]), max_tokens=20, buffer=4)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.75, -1.0])
