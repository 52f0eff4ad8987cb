"""Logprobs of a batch of groups whose rows share a prompt, paying for each prompt once and for no
padding.

The G completions of a group share their prompt; the full-row path (`rlvr.modeling.logprobs.token_logprobs`)
runs the prompt through the model G times, forward and backward, and pads every row to the longest.
Here the micro-batch is packed: each group's prompt once, then its completions, laid end to end in
rows ("lanes") of at most `PACK_TOKENS` tokens (or of the longest prompt + completion, if longer),
evened out to the narrowest width that needs no more lanes, and one forward runs them all. A 4-D
attention mask lets a prompt token see the prompt before it, and a completion token its group's
prompt and the tokens before it in its own completion, nothing else; every token gets its true
position through `position_ids`. The prompt's last position scores the
first token of each of its completions, so the gradient of G completions flows into the one prompt
computation, exactly as G full rows would give it. A group whose completions do not fit in one lane
continues in the next, its prompt placed again there. Completion lengths vary widely within a group
(3 to 48 tokens in one step of `make train`), so padded rows ran the model on ~40 % padding.
Tested equal to the full-row path (logprobs, loss and every parameter's gradient) on the tiny and
the default model, and on a tiny model of each family in `TESTED`.
"""

from __future__ import annotations

import torch

from rlvr.modeling.logprobs import target_logprobs

# Model families (config.model_type) on which this path is tested equal to the full rows
# (tests/test_families.py): sliding windows, q/k norms, soft-capping, scaled and fused layers among them.
TESTED = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "mistral", "phi3", "olmo2", "granite")
# Tokens packed into one row of the forward (at least the longest prompt + completion). Attention over a
# packed row costs its length squared instead of the sum of its sequences' squares; at 512 that is
# small beside the rest of the model.
PACK_TOKENS = 512


def pack(groups: list[int], prompt_lens: list[int], lens: list[int], width: int) -> list[list[tuple[int, int]]]:
    """Lanes of at most `width` tokens for rows of `groups` (adjacent rows of a group share its prompt)
    with prompts of `prompt_lens` and completions of `lens` (each prompt + completion <= width): each lane
    a list of (row, kind) segments in order, kind 0 the row's prompt (its group's), 1 its completion."""
    lanes: list[list[tuple[int, int]]] = []
    used, group = width + 1, None  # no lane yet
    for i, (g, p, c) in enumerate(zip(groups, prompt_lens, lens, strict=True)):
        need = c + (p if g != group else 0)
        if used + need > width:  # a new lane, where the group's prompt goes first
            lanes.append([])
            used, group, need = 0, None, p + c
        if g != group:
            lanes[-1].append((i, 0))
            group = g
        lanes[-1].append((i, 1))
        used += need
    return lanes


def lanes_of(attention_mask: torch.Tensor, prompt_lens: torch.Tensor, groups: torch.Tensor,
             pack_tokens: int = PACK_TOKENS) -> tuple[list[list[tuple[int, int]]], list[int], list[int]]:
    """(lanes as `pack` lays them, prompt lengths, completion lengths) of a micro-batch of right-padded
    rows: as many lanes as `pack_tokens` tokens each (or the longest prompt + completion, if longer) need,
    each as narrow as that number allows."""
    p, lens, groups = prompt_lens.tolist(), (attention_mask.sum(dim=1) - prompt_lens).tolist(), groups.tolist()
    longest = max(a + b for a, b in zip(p, lens, strict=True))
    count = len(pack(groups, p, lens, max(pack_tokens, longest)))
    # The forward runs [lanes, width] with width its longest lane: even the lanes out, to the narrowest width
    # that packs them into as many (a last lane a quarter full would otherwise be paid for in full).
    lo, hi = longest, max(pack_tokens, longest)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(pack(groups, p, lens, mid)) <= count else (mid + 1, hi)
    return pack(groups, p, lens, hi), p, lens


def packed_shape(attention_mask: torch.Tensor, prompt_lens: torch.Tensor, groups: torch.Tensor,
                 pack_tokens: int = PACK_TOKENS) -> tuple[int, int, int]:
    """(lanes, width, tokens) of the forward `shared_prefix_logprobs` runs for this micro-batch: its
    [lanes, width] shape, and the tokens in it: each group's prompt once per lane it is placed in, and
    every completion token."""
    lanes, p, lens = lanes_of(attention_mask, prompt_lens, groups, pack_tokens)
    widths = [sum(lens[i] if kind else p[i] for i, kind in parts) for parts in lanes]
    return len(lanes), max(widths), sum(widths)


def attention_masks(config, allowed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask the model takes for a packed forward whose tokens may see what `allowed` [lanes, 1, W, W]
    says, at `positions` [lanes, W]: with a sliding window (Mistral's on every layer; Gemma's on the
    layers `config.layer_types` names) a token also sees only the `sliding_window` positions up to its
    own, as transformers' own masks have it; a model of several layer types takes one mask per type.
    SDPA takes a boolean mask; eager attention adds its mask to the scores."""
    window = getattr(config, "sliding_window", None)
    sliding = allowed
    if window is not None:
        sliding = allowed & (positions[:, None, :, None] - positions[:, None, None, :] < window)

    def kernel_mask(m: torch.Tensor) -> torch.Tensor:
        if config._attn_implementation != "eager":
            return m
        return torch.zeros(m.shape, device=m.device).masked_fill_(~m, torch.finfo(torch.float32).min)

    types = getattr(config, "layer_types", None)
    if types is None:
        return kernel_mask(sliding)
    return {kind: kernel_mask(sliding if kind == "sliding_attention" else allowed) for kind in set(types)}


def shared_prefix_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           prompt_lens: torch.Tensor, groups: torch.Tensor, temperature: float = 1.0,
                           pack_tokens: int = PACK_TOKENS) -> torch.Tensor:
    """Logprobs [n, T-1] of the completion tokens of `input_ids` [n, T] (right-padded prompt +
    completion rows; row i's prompt is its first `prompt_lens[i]` tokens, rows of one group are
    adjacent and share their prompt), in the layout of `token_logprobs`: position t scores token t+1.
    Prompt and padding positions are 0."""
    n, t = input_ids.shape
    device = input_ids.device
    lanes, p, lens = lanes_of(attention_mask, prompt_lens, groups, pack_tokens)
    # Each packed token: where it goes (lane, column), what it is (row, position in the row), its segment
    # (a prompt or a completion placed in a lane) and the prompt segment that a completion token also sees.
    where, source, segment, sees, lengths = [], [], [], [], []
    scorer = [(0, 0)] * n  # (lane, column) of the prompt's last token, whose logits score row i's first token
    for lane, parts in enumerate(lanes):
        col = 0
        for s, (i, kind) in enumerate(parts):
            span = range(p[i]) if kind == 0 else range(p[i], p[i] + lens[i])
            where += [(lane, col + j) for j in range(len(span))]
            source += [(i, j) for j in span]
            segment += [s] * len(span)
            if kind == 0:
                prompt, scorer_of_group = s, (lane, col + p[i] - 1)
            else:
                scorer[i] = scorer_of_group
            sees += [prompt if kind else -1] * len(span)
            col += len(span)
        lengths.append(col)
    lane, col = torch.tensor(where, device=device).T  # [P] each, P packed tokens
    row, pos = torch.tensor(source, device=device).T  # [P]
    shape = (len(lanes), max(lengths))
    ids = torch.zeros(shape, dtype=input_ids.dtype, device=device).index_put((lane, col), input_ids[row, pos])
    positions = torch.zeros_like(ids).index_put((lane, col), pos)
    seg = torch.full_like(ids, -1).index_put((lane, col), torch.tensor(segment, device=device))  # [lanes, W]
    ctx = torch.full_like(ids, -1).index_put((lane, col), torch.tensor(sees, device=device))  # [lanes, W]
    # A token sees the tokens before it in its own segment and, a completion token, its prompt's segment;
    # a pad only itself (a softmax row with nothing in it would be NaN).
    w = shape[1]
    cols = torch.arange(w, device=device)
    allowed = ((seg[:, :, None] == seg[:, None, :]) & (cols[None, :] <= cols[:, None]) & (seg[:, :, None] >= 0)
               | (ctx[:, :, None] == seg[:, None, :]) & (ctx[:, :, None] >= 0)
               | torch.eye(w, dtype=torch.bool, device=device))[:, None]  # [lanes, 1, W, W]
    mask = attention_masks(model.config, allowed, positions)
    # Logits only where they score something: completion tokens (the next one) and prompts' last tokens.
    s_lane, s_col = torch.tensor(scorer, device=device).T  # [n]
    scores = (ctx >= 0).index_put((s_lane, s_col), torch.tensor(True, device=device))
    keep = scores.any(dim=0).nonzero().flatten()  # [C] columns
    at = torch.zeros(w, dtype=torch.long, device=device).index_put((keep,), torch.arange(len(keep), device=device))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                   logits_to_keep=keep).logits  # [lanes, C, V]

    # Completion token r is scored by the logits before it: its prompt's last for r = 0 (one prompt position
    # scores each of its G completions' first tokens), else the packed token before it.
    completion = ctx[lane, col] >= 0  # [P]
    lane, col, row, pos = lane[completion], col[completion], row[completion], pos[completion]  # [L] completion tokens
    first = pos == prompt_lens[row]
    by_lane, by_col = torch.where(first, s_lane[row], lane), torch.where(first, s_col[row], col - 1)
    logprobs = target_logprobs(logits, input_ids[row, pos], temperature,
                               positions=by_lane * len(keep) + at[by_col])  # [L], float32
    return torch.zeros(n, t, dtype=logprobs.dtype, device=device).index_put((row, pos - 1), logprobs)[:, :-1]
