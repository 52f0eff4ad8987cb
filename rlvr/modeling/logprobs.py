"""Logprobs of target tokens: `token_logprobs` runs a model over token ids (the learner, the transformers
engine and the tests use it); `target_logprobs` takes the float32 logprob of each target token from
the logits, without float32 copies of them.

`logits.float().div(T).gather(...) - logits.float().div(T).logsumexp(...)` is the plain way; over a
vocabulary of 49k and a thousand tokens each of its steps (the cast, the division, the exponentials,
and in the backward the zeros that `gather` scatters into and the softmax of `logsumexp`) is a pass
over a [tokens, V] float32 tensor, ~200 MB, and autograd keeps two of them. Here one function does
forward and backward a few positions at a time in float32 (~16 MB of temporaries, 85 positions of a
49k vocabulary; chunks of a whole packed lane, 425 positions, took 2.5x as long), keeps only the
logits as they came (bf16 under autocast; a copy if they are not contiguous) and one logsumexp per
position, and writes the gradient in the logits' dtype (what the plain path's cast
back gives the LM head too). Tested equal to the plain path, values and gradients.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**22  # float32 temporaries per pass: ~16 MB


class _TargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor,
                temperature: float) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])  # [P, V] (a copy if `logits` is not contiguous)
        rows = max(1, CHUNK_ELEMENTS // flat.shape[1])
        lse = torch.empty(len(flat), dtype=torch.float32, device=logits.device)  # [P]
        for i in range(0, len(flat), rows):
            lse[i : i + rows] = (flat[i : i + rows].float() / temperature).logsumexp(dim=-1)
        ctx.save_for_backward(logits, positions, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return flat[positions, targets].float() / temperature - lse[positions]  # [K]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, positions, targets, lse = ctx.saved_tensors
        t = ctx.temperature
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat, out_flat = logits.reshape(-1, logits.shape[-1]), out.view(-1, logits.shape[-1])  # [P, V]
        # d logprob_k / d logits at its position = (onehot(target_k) - softmax) / temperature
        g = grad.float() / t  # [K]
        total = torch.zeros(len(flat), dtype=torch.float32, device=g.device).index_add_(0, positions, g)  # [P]
        # the pairs by position (stable: a position's own in their order), and where each chunk's begin
        order = positions.argsort(stable=True)
        positions, targets, g = positions[order], targets[order], g[order]
        starts = range(0, len(flat), ctx.rows)
        bounds = torch.searchsorted(positions, torch.tensor([*starts, len(flat)], device=g.device)).tolist()
        for k, i in enumerate(starts):
            s, pairs = slice(i, i + ctx.rows), slice(bounds[k], bounds[k + 1])
            part = (flat[s].float() / t).sub_(lse[s, None]).exp_().mul_(-total[s, None])  # -softmax * g
            part.index_put_((positions[pairs] - i, targets[pairs]), g[pairs], accumulate=True)
            out_flat[s] = part
        return out, None, None, None


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    positions: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(logits / temperature) at `targets`: logits [..., V] (any float dtype), targets of
    the same shape less V -> float32 of that shape, differentiable in `logits`. With `positions` [K]
    (indices into the positions of `logits`, flattened: [P, V]), targets [K] -> [K]: the logprob of
    targets[k] at position positions[k]; a position may score several targets."""
    if positions is None:
        if logits.shape[:-1] != targets.shape:
            raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match")
        flat = torch.arange(targets.numel(), device=targets.device)
        return _TargetLogprobs.apply(logits, flat, targets.reshape(-1), temperature).view(targets.shape)
    return _TargetLogprobs.apply(logits, positions, targets, temperature)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """Logprobs [N, T-1] of tokens 1.. of `input_ids` [N, T] under `model`, in one batched forward.

    Only positions `start`.. go through the LM head (the rest are 0): with long prompts, logits over
    the whole vocabulary at every prompt position would cost more than the rest of the model.
    """
    t = input_ids.shape[1]
    keep = torch.arange(start, t - 1, device=input_ids.device)  # the last position predicts nothing
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                   logits_to_keep=keep).logits  # [N, t - 1 - start, V]: positions start..t-2
    logprobs = target_logprobs(logits, input_ids[:, start + 1 :], temperature)  # position s predicts s+1
    return torch.nn.functional.pad(logprobs, (start, 0))
