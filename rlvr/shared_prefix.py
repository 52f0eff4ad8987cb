"""Logprobs of a batch of groups whose rows share a prompt, paying for each prompt once and for no
padding.

The G completions of a group share their prompt; the full-row path (`rlvr.learner.token_logprobs`)
runs the prompt through the model G times, forward and backward. Here each distinct prompt of a
micro-batch is forwarded once, with its keys and values cached, and the completions attend to it.

The completions are packed: laid end to end in rows ("lanes") of `PACK_TOKENS` tokens (or the longest
completion, if longer), instead of one right-padded row each. Completion lengths vary widely within a
group (3 to 48 tokens in one step of `make train`), so a padded [rows, longest] layout ran the model
on ~40 % padding. A 4-D attention mask lets each packed token see its group's prompt and the tokens
before it in its own completion, nothing else; every token gets its true position through
`position_ids`. The prompts' cache is laid out as one sequence of all the micro-batch's prompts
(its backward sums every lane's gradient into the one prompt computation, exactly as G copies of
the prompt would receive them). Prompts are right-padded (a left pad would be a query row with
nothing to attend to); their pads are masked out. Tested equal to the full-row path (logprobs, loss
and every parameter's gradient) on the tiny and the default model.
"""

from __future__ import annotations

import torch

from rlvr.logprobs import target_logprobs

# Model families (config.model_type) on which this path is tested equal to the full rows.
TESTED = ("llama",)
# Completion tokens packed into one row of the completion forward (at least the longest completion).
# Attention over a packed row costs (prompts + row)^2 instead of the sum of (prompt + completion)^2 of
# its rows; at 512 that is small beside the rest of the model for any completion length.
PACK_TOKENS = 512


def group_starts(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For rows [n] sorted by group: (index of each group's first row [K], each row's group 0..K-1 [n])."""
    _, inverse = torch.unique_consecutive(groups, return_inverse=True)
    first = torch.ones_like(groups, dtype=torch.bool)
    first[1:] = groups[1:] != groups[:-1]
    return first.nonzero().flatten(), inverse


def pack(lens: list[int], width: int) -> tuple[list[int], list[int]]:
    """Lay completions of lengths `lens` end to end, in order, in lanes of at most `width` tokens
    (each length <= width): (lane of each completion, column where it starts)."""
    lanes, starts, lane, used = [], [], 0, 0
    for n in lens:
        if used + n > width:
            lane, used = lane + 1, 0
        lanes.append(lane)
        starts.append(used)
        used += n
    return lanes, starts


def shared_prefix_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           prompt_lens: torch.Tensor, groups: torch.Tensor, temperature: float = 1.0,
                           pack_tokens: int = PACK_TOKENS) -> torch.Tensor:
    """Logprobs [n, T-1] of the completion tokens of `input_ids` [n, T] (right-padded prompt +
    completion rows; row i's prompt is its first `prompt_lens[i]` tokens, rows of one group are
    adjacent and share their prompt), in the layout of `token_logprobs`: position t scores token t+1.
    Prompt and padding positions are 0."""
    n, t = input_ids.shape
    device = input_ids.device
    first, inverse = group_starts(groups)
    p = prompt_lens[first]  # [K] prompt length of each group
    k, p_max = len(first), int(p.max())
    prompt_mask = (torch.arange(p_max, device=device)[None] < p[:, None]).long()  # [K, p_max]
    prompt_ids = input_ids[first, :p_max] * prompt_mask
    # The last prompt token's logits score the first completion token: keep the positions that can hold it.
    keep = p_max - int(p.min()) + 1
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, logits_to_keep=keep)
    last = out.logits[torch.arange(k, device=device), p - 1 - (p_max - keep)]  # [K, V]
    cache = out.past_key_values

    # Every completion token: its row, its offset r in its completion, and where it sits when packed.
    lens = attention_mask.sum(dim=1) - prompt_lens  # [n] completion lengths
    lane_of, start_of = pack(lens.tolist(), max(int(lens.max()), pack_tokens))
    row = torch.repeat_interleave(torch.arange(n, device=device), lens)  # [L]
    r = torch.arange(len(row), device=device) - (lens.cumsum(0) - lens)[row]  # [L]
    lane = torch.tensor(lane_of, device=device)[row]  # [L]
    col = torch.tensor(start_of, device=device)[row] + r  # [L]
    lanes, width = lane_of[-1] + 1, int(col.max()) + 1
    target = prompt_lens[row] + r  # [L] each token's position in its full row
    ids = torch.zeros(lanes, width, dtype=input_ids.dtype, device=device).index_put((lane, col), input_ids[row, target])
    positions = torch.zeros_like(ids).index_put((lane, col), target)
    owner = torch.full_like(ids, -1).index_put((lane, col), row)  # [lanes, W] the row of each packed token; -1: pad

    # A packed token sees its group's prompt (minus its pads) and its own completion up to itself; a pad
    # sees only itself (a softmax row with nothing in it would be NaN).
    cols = torch.arange(width, device=device)
    own = (owner[:, :, None] == owner[:, None, :]) & (cols[None, :] <= cols[:, None])  # [lanes, W, W]
    own |= torch.eye(width, dtype=torch.bool, device=device)
    group = torch.where(owner >= 0, inverse[owner.clamp(min=0)], -1)  # [lanes, W]
    key_group = torch.arange(k, device=device).repeat_interleave(p_max)  # [K * p_max]
    to_prompt = (group[:, :, None] == key_group) & prompt_mask.flatten().bool()  # [lanes, W, K * p_max]
    allowed = torch.cat([to_prompt, own], dim=-1)[:, None]  # [lanes, 1, W, K * p_max + W]
    mask = allowed  # SDPA takes a boolean mask; eager attention adds its mask to the scores
    if model.config._attn_implementation == "eager":
        mask = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    # The prompts' cache as one sequence that every lane reads: [K, h, p_max, d] -> [lanes, h, K * p_max, d].
    # (transformers' DynamicCache holds each layer's tensors in .keys / .values; reorder_cache sets them alike.)
    for layer in cache.layers:
        layer.keys, layer.values = (x.transpose(0, 1).reshape(1, x.shape[1], k * p_max, x.shape[3])
                                    .expand(lanes, -1, -1, -1) for x in (layer.keys, layer.values))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True).logits  # [lanes, W, V]

    # Completion token r is scored by the logits before it: its prompt's last for r = 0, else the packed
    # token before it. (Logits at a completion's last token, or across a boundary, score nothing used.)
    firsts = target_logprobs(last[inverse][:, None], input_ids[torch.arange(n, device=device),
                                                               prompt_lens.clamp(max=t - 1)][:, None], temperature)
    rest = torch.nn.functional.pad(target_logprobs(logits[:, :-1], ids[:, 1:], temperature), (1, 0))  # [lanes, W]
    logprobs = torch.where(r == 0, firsts[row, 0], rest[lane, col])  # [L], float32
    out = torch.zeros(n, t, dtype=logprobs.dtype, device=device)
    return out.index_put((row, target - 1), logprobs)[:, :-1]
