"""The float32 logprob of each target token from a model's logits, without float32 copies of them.

`logits.float().div(T).gather(...) - logits.float().div(T).logsumexp(...)` is the plain way; over a
vocabulary of 49k and a thousand tokens each of its steps (the cast, the division, the exponentials,
and in the backward the zeros that `gather` scatters into and the softmax of `logsumexp`) is a pass
over a [tokens, V] float32 tensor, ~200 MB, and autograd keeps two of them. Here one function does
forward and backward ~85 tokens at a time in float32 (~16 MB of temporaries; chunks of a whole packed
lane, 425 tokens, took 2.5x as long), keeps only the logits as they came (bf16 under autocast) and
one logsumexp per token, and writes the gradient in the logits' dtype (what the plain path's cast
back gives the LM head too). Tested equal to the plain path, values and gradients.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**22  # float32 temporaries per pass: ~16 MB


class _TargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])  # [tokens, V] (a copy if `logits` is not contiguous)
        rows = max(1, CHUNK_ELEMENTS // flat.shape[1])
        lse = torch.empty(len(flat), dtype=torch.float32, device=logits.device)
        for i in range(0, len(flat), rows):
            lse[i : i + rows] = (flat[i : i + rows].float() / temperature).logsumexp(dim=-1)
        lse = lse.view(targets.shape)  # [N, T]
        picked = logits.gather(-1, targets[..., None]).squeeze(-1).float() / temperature  # [N, T]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return picked - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        t = ctx.temperature
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat, out_flat = logits.reshape(-1, logits.shape[-1]), out.view(-1, logits.shape[-1])  # [tokens, V]
        targets, lse = targets.reshape(-1, 1), lse.reshape(-1, 1)
        g = (grad.float() / t).reshape(-1, 1)  # d logprob / d logit = (onehot - softmax) / temperature
        for i in range(0, len(flat), ctx.rows):
            s = slice(i, i + ctx.rows)
            part = (flat[s].float() / t).sub_(lse[s]).exp_().mul_(-g[s])  # -softmax * g
            part.scatter_add_(-1, targets[s], g[s])
            out_flat[s] = part
        return out, None, None


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at `targets`: logits [N, T, V] (any float dtype), targets
    [N, T] -> float32 [N, T], differentiable in `logits`."""
    return _TargetLogprobs.apply(logits, targets, temperature)
