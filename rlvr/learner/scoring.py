"""The learner's forwards: logprobs of a batch's target tokens under the policy or its reference, in
micro-batches, each group's prompt forwarded once (`rlvr.learner.shared_prefix`), with the attention kernel
picked per forward and, across processes, idle passes that keep the FSDP ranks in step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rlvr import distributed
from rlvr.learner.batch import make_batch
from rlvr.learner.policy import Policy
from rlvr.learner.shared_prefix import TESTED, packed_shape, shared_prefix_logprobs
from rlvr.modeling.kernels import attention_kernel, attention_kernels
from rlvr.modeling.logprobs import token_logprobs
from rlvr.records import Batch, Prompt, Rollout


def shared_prefix_choice(setting: str | bool, model_type: str, group_size: int) -> tuple[bool, str]:
    """Whether the learner forwards each group's prompt once (`learner.shared_prefix`), and why."""
    if setting is True or setting is False:
        return setting, "as configured"
    if model_type not in TESTED:
        return False, f"not tested on {model_type!r} models (tested: {', '.join(TESTED)})"
    return True, f"a {model_type} model; each prompt is forwarded once instead of {group_size} times"


class Scorer:
    """Logprobs of the policy's (or its reference's) tokens, as the update and the canary need them."""

    def __init__(self, policy: Policy, micro_batch_size: int, shared_prefix: str | bool, group_size: int,
                 temperature: float, bf16: bool):
        self.policy, self.micro_batch_size, self.temperature, self.bf16 = policy, micro_batch_size, temperature, bf16
        self.shared_prefix, self.shared_prefix_why = shared_prefix_choice(
            shared_prefix, policy.model.config.model_type, group_size)
        self.tokens = 0  # tokens through a model since the last reset (the learner's step resets it)
        # Across processes a rank with fewer micro-batches than the others (or none: DAPO may keep fewer
        # groups than there are ranks) runs this one-row batch at zero weight, to match their passes.
        pad = policy.pad_id
        self.idle = make_batch([Rollout(Prompt([], ""), 0, [pad], [pad], [0.0], "", "stop")], pad)

    def forward_context(self, bf16: bool | None = None) -> contextlib.ExitStack:
        """What a forward (and its backward) runs under: bf16 autocast under bf16-mixed (or as `bf16` says),
        and on CUDA SDPA without cuDNN's attention (`SDPA_BACKENDS`)."""
        stack = contextlib.ExitStack()
        if self.bf16 if bf16 is None else bf16:
            stack.enter_context(torch.autocast(device_type=torch.device(self.policy.device).type, dtype=torch.bfloat16))
        stack.enter_context(attention_kernels(self.policy.device))
        return stack

    def _pick_attention(self, model: torch.nn.Module, rows: int, width: int) -> None:
        """Switch `model` to the attention kernel for this forward (`attention_kernel`); every attention
        layer reads it at each forward."""
        kernel = attention_kernel(self.policy.device, rows, width, model.config.num_attention_heads)
        if model.config._attn_implementation != kernel:
            model.set_attn_implementation(kernel)

    def forward(self, model: torch.nn.Module, part: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(logprobs [n, t], loss mask [n, t], width) of a micro-batch, trimmed of all-padding columns."""
        device = self.policy.device
        width = int(part.attention_mask.sum(dim=1).max())
        ids, attn = part.input_ids[:, :width].to(device), part.attention_mask[:, :width].to(device)
        mask = part.loss_mask[:, : width - 1].to(device)
        with self.forward_context():  # the logprobs themselves are float32 (target_logprobs)
            if self.shared_prefix:
                lanes, lane_width, tokens = packed_shape(part.attention_mask, part.prompt_lens, part.groups)
                self._pick_attention(model, lanes, lane_width)
                self.tokens += tokens
                return (shared_prefix_logprobs(model, ids, attn, part.prompt_lens.to(device),
                                               part.groups.to(device), self.temperature), mask, width)
            self._pick_attention(model, len(part), width)
            self.tokens += int(part.attention_mask.sum())
            scored = part.loss_mask[:, : width - 1].any(dim=0).nonzero()  # positions whose logprob anything uses
            start = int(scored[0]) if len(scored) else width - 2
            return token_logprobs(model, ids, attn, self.temperature, start), mask, width

    def micro_batches(self, rows: torch.Tensor, unit: int = 1) -> Iterator[torch.Tensor | None]:
        """`rows` in micro-batches (of a multiple of `unit` rows: a preference pair stays whole), then None
        for each pass this rank must still run (idle) to match the rank with the most."""
        size = max(unit, self.micro_batch_size // unit * unit)
        starts = range(0, len(rows), size)
        for k in range(int(distributed.global_max(len(starts)))):  # as many passes as every other rank
            yield rows[starts[k] : starts[k] + size] if k < len(starts) else None

    @torch.no_grad()
    def batch_logprobs(self, batch: Batch, reference: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logprobs [N, T-1] of every target token under the policy (or the frozen reference), no grad;
        only of the sequences `rows` (default: all), the others left at 0."""
        out = torch.zeros_like(batch.old_logprobs)
        rows = torch.arange(len(batch)) if rows is None else rows
        with self.policy.reference() if reference else contextlib.nullcontext(self.policy.model) as model:
            for sel in self.micro_batches(rows):
                if sel is None:
                    self.forward(model, self.idle)  # nothing left here: a pass to match theirs
                    continue
                logp, _, width = self.forward(model, batch.select(sel))
                out[sel, : width - 1] = logp.cpu()
        return out

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int], other_precision: bool = False) -> torch.Tensor:
        """Logprobs [len - 1] of tokens 1.. of one sequence at temperature 1 (for the canary), without
        dropout: the deterministic policy the engine serves. `other_precision`: computed in float32 under
        bf16-mixed, under bf16 autocast in fp32 (the canary's second reference: how far rounding alone
        moves them)."""
        model = self.policy.model
        ids = torch.tensor([token_ids], device=self.policy.device)
        self._pick_attention(model, 1, len(token_ids))  # the same kernel at every check: bit-for-bit logprobs
        model.eval()
        try:
            with self.forward_context(self.bf16 != other_precision):
                return token_logprobs(model, ids, torch.ones_like(ids))[0]
        finally:
            model.train()
