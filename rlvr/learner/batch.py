"""A step's rollouts as the learner's tensors: one `Batch` of right-padded sequences."""

from __future__ import annotations

import torch

from rlvr.records import Batch, Rollout


def make_batch(rollouts: list[Rollout], pad_id: int, mask_truncated: bool = False) -> Batch:
    """Right-padded tensors of prompt + completion for every rollout; advantages are zero until set.

    `mask_truncated` drops completions cut at max_tokens out of the loss (DAPO's overlong filtering).
    Adjacent rollouts with the same prompt form one group (the shared-prefix learner forwards it once).
    """
    seqs = [r.prompt_ids + r.completion_ids for r in rollouts]
    n, t = len(seqs), max((len(s) for s in seqs), default=1)  # (no rollouts: a rank with no share of a step)
    input_ids = torch.full((n, t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, t), dtype=torch.long)
    loss_mask = torch.zeros((n, t - 1))
    old_logprobs = torch.zeros((n, t - 1))
    for i, (r, s) in enumerate(zip(rollouts, seqs, strict=True)):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
        if not (mask_truncated and r.finish_reason == "length"):
            # target position p-1 scores the first completion token; tool results stay out of the loss
            loss_mask[i, p - 1 : p - 1 + c] = torch.tensor(r.model_mask, dtype=loss_mask.dtype)
        old_logprobs[i, p - 1 : p - 1 + c] = torch.tensor(r.sampler_logprobs)
    new_group = [int(i > 0 and r.prompt_ids != rollouts[i - 1].prompt_ids) for i, r in enumerate(rollouts)]
    groups = torch.tensor(new_group, dtype=torch.long).cumsum(0)  # [N]
    return Batch(input_ids, attention_mask, loss_mask, old_logprobs, torch.zeros(n),
                 torch.tensor([len(r.prompt_ids) for r in rollouts]), groups)
