"""The fused target-logprob function against the plain float32 path: values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.modeling import logprobs
from rlvr.modeling.logprobs import target_logprobs


def plain(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float() / temperature
    return x.gather(-1, targets[..., None]).squeeze(-1) - x.logsumexp(dim=-1)


def test_hand_computed_values_and_gradient():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)  # softmax (1/4, 3/4)
    out = target_logprobs(logits, torch.tensor([[1]]))
    assert out.item() == pytest.approx(math.log(0.75))
    out.sum().backward()
    assert logits.grad.flatten().tolist() == pytest.approx([-0.25, 0.25])  # onehot - softmax
    # at temperature 2 the logits are halved: softmax of (0, ln 3 / 2) = (1, sqrt 3) / (1 + sqrt 3)
    logits.grad = None
    target_logprobs(logits, torch.tensor([[0]]), temperature=2.0).sum().backward()
    p0 = 1 / (1 + math.sqrt(3))
    assert logits.grad.flatten().tolist() == pytest.approx([(1 - p0) / 2, -(1 - p0) / 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_the_plain_path_in_chunks_on_a_strided_view(monkeypatch, dtype):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 14 * 50)  # 14 tokens a pass, 3 passes for 35
    g = torch.Generator().manual_seed(0)
    full = (4 * torch.randn(5, 8, 50, generator=g)).to(dtype).requires_grad_()
    targets = torch.randint(0, 50, (5, 7), generator=g)
    weights = torch.randn(5, 7, generator=g)  # a loss that weighs every logprob differently
    grads = []
    for fn in (target_logprobs, plain):
        full.grad = None
        out = fn(full[:, :-1], targets, 0.7)  # the learner's view: the last position predicts nothing
        (out * weights).sum().backward()
        grads.append(full.grad.clone())
        if fn is target_logprobs:
            fused = out.detach()
            assert out.dtype == torch.float32
    torch.testing.assert_close(fused, plain(full[:, :-1], targets, 0.7).detach(), rtol=1e-6, atol=1e-5)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-3}
    torch.testing.assert_close(grads[0], grads[1], **tol)
    assert grads[0][:, -1].abs().sum() == 0  # no gradient into the position left out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_positions_that_score_several_targets(monkeypatch, dtype):
    """The packed learner's form: one prompt position scores the first token of each of its
    completions. Against the plain path on each (position, target) pair, values and gradients, over
    chunks that split the positions."""
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 5 * 50)  # 5 positions a pass, 3 passes for 12
    g = torch.Generator().manual_seed(0)
    full = (4 * torch.randn(3, 4, 50, generator=g)).to(dtype).requires_grad_()
    positions = torch.tensor([0, 0, 5, 11, 5, 7, 0, 5])
    targets = torch.randint(0, 50, (8,), generator=g)
    targets[7] = targets[2]  # one (position, target) pair twice: two completions that start alike
    weights = torch.randn(8, generator=g)
    fused = target_logprobs(full, targets, 0.7, positions=positions)
    (fused * weights).sum().backward()
    exact = full.detach().float().requires_grad_()  # the reference in float32, summed before any rounding
    plain_out = plain(exact.reshape(12, 50)[positions], targets, 0.7)
    (plain_out * weights).sum().backward()
    torch.testing.assert_close(fused.detach(), plain_out.detach(), rtol=1e-6, atol=1e-5)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-3}
    torch.testing.assert_close(full.grad.float(), exact.grad, **tol)


def test_logits_and_targets_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match=r"logits \(2, 5, 50\) and targets \(2, 4\) do not match"):
        target_logprobs(torch.zeros(2, 5, 50), torch.zeros(2, 4, dtype=torch.long))
