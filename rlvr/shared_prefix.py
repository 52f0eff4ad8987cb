"""Logprobs of a batch of groups whose rows share a prompt, paying for each prompt once.

The G completions of a group share their prompt; the full-row path (`rlvr.learner.token_logprobs`)
runs the prompt through the model G times, forward and backward. Here each distinct prompt of a
micro-batch is forwarded once, with its keys and values cached; the cache is then indexed out to
the group's rows (`index_select`, whose backward sums the rows' gradients into the one prompt
computation, exactly as G copies would receive them), and the completions attend to it.

Prompts are right-padded (a left pad would be a query row with nothing to attend to, NaN in SDPA);
the pads sit between prompt and completion in the cache, masked out by the 2-D attention mask, and
every completion token gets its true position through `position_ids`. Tested equal to the full-row
path (logprobs, loss and every parameter's gradient) on the tiny and the default model.
"""

from __future__ import annotations

import torch

from rlvr.logprobs import target_logprobs

# Model families (config.model_type) on which this path is tested equal to the full rows.
TESTED = ("llama",)


def group_starts(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows [n] sorted by group: (index of each group's first row [K], each row's group 0..K-1 [n])."""
    _, inverse = torch.unique_consecutive(groups, return_inverse=True)
    first = torch.ones_like(groups, dtype=torch.bool)
    first[1:] = groups[1:] != groups[:-1]
    return first.nonzero().flatten(), inverse


def shared_prefix_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           prompt_lens: torch.Tensor, groups: torch.Tensor,
                           temperature: float = 1.0) -> torch.Tensor:
    """Logprobs [n, T-1] of the completion tokens of `input_ids` [n, T] (right-padded prompt +
    completion rows; row i's prompt is its first `prompt_lens[i]` tokens, rows of one group are
    adjacent and share their prompt), in the layout of `token_logprobs`: position t scores token t+1.
    Prompt and padding positions are 0."""
    n, t = input_ids.shape
    device = input_ids.device
    first, inverse = group_starts(groups)
    p = prompt_lens[first]  # [K] prompt length of each group
    p_max = int(p.max())
    prompt_mask = (torch.arange(p_max, device=device)[None] < p[:, None]).long()  # [K, p_max]
    prompt_ids = input_ids[first, :p_max] * prompt_mask
    # The last prompt token's logits score the first completion token: keep the positions that can hold it.
    keep = p_max - int(p.min()) + 1
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, logits_to_keep=keep)
    last = out.logits[torch.arange(len(first), device=device), p - 1 - (p_max - keep)]  # [K, V]
    cache = out.past_key_values
    cache.reorder_cache(inverse)  # [K, ...] -> [n, ...]: each row reads its group's prompt

    lens = attention_mask.sum(dim=1) - prompt_lens  # [n] completion lengths
    r = torch.arange(int(lens.max()), device=device)  # [R]
    comp_mask = (r[None] < lens[:, None]).long()  # [n, R]
    comp_ids = input_ids.gather(1, (prompt_lens[:, None] + r[None]).clamp(max=t - 1)) * comp_mask
    out = model(input_ids=comp_ids, attention_mask=torch.cat([prompt_mask[inverse], comp_mask], dim=1),
                position_ids=prompt_lens[:, None] + r[None], past_key_values=cache, use_cache=True)
    # Completion token r is scored by the logits before it: the prompt's last, then completion r - 1.
    logits = torch.cat([last[inverse][:, None], out.logits[:, :-1]], dim=1)  # [n, R, V]
    logprobs = target_logprobs(logits, comp_ids, temperature)  # [n, R], float32
    # Into the full-row layout; padded completion positions go to a spare last column, dropped.
    target = torch.where(comp_mask.bool(), prompt_lens[:, None] - 1 + r[None], t - 1)
    return torch.zeros(n, t, dtype=logprobs.dtype, device=device).scatter(1, target, logprobs)[:, :-1]
