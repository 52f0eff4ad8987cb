"""The records passed between the stages of a training step.

Prompt (task) -> Rollout (engine) -> scored Rollout (rewards) -> Batch (learner).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not imported at run time: reward worker processes unpickle Prompts cheaply
    import torch


@dataclass
class Prompt:
    """One task instance: chat messages for the model and what the reward needs to check it."""

    messages: list[dict[str, str]]  # [{"role": "system" | "user", "content": str}, ...]
    answer: str  # ground truth, as the reward reads it
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the curriculum level
    # Functions offered with this prompt alone (OpenAI-style tool schemas), presented as the run's tools
    # are (rlvr.prompts.render_with_tools) but never run: the model's call is its answer (e.g. BFCL's).
    tools: list[dict[str, Any]] | None = None


@dataclass
class Demonstration:
    """A worked answer to a prompt, for the cold start: the turns after the prompt, as the model should
    write them (assistant messages, with tool calls written in the rollouts' protocol) and the tool
    results between them."""

    prompt: Prompt
    turns: list[dict[str, str]]  # [{"role": "assistant" | "tool", "content": str}, ...], ending with the assistant


@dataclass
class Rollout:
    """One sampled completion of one prompt, with what the sampler saw."""

    prompt: Prompt
    group: int  # index of its prompt in the step's batch; the G samples of a prompt share it
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]  # one per completion token, under the sampling temperature (0 off model_mask)
    text: str
    finish_reason: str  # "stop" (eos or stop string) | "length" (hit rollout.max_tokens)
    rewards: dict[str, float] = field(default_factory=dict)  # per term, unweighted
    reward: float = 0.0  # weighted total
    reward_errors: dict[str, str] = field(default_factory=dict)  # per failed term: what went wrong
    # Multi-turn rollouts with tools (rlvr.rollout.tools); a single-turn rollout leaves these empty.
    # completion_ids then holds every turn and tool result; 1 marks the model's own tokens (in the
    # loss, with a sampler logprob), 0 the tokens rlvr appended (tool results, turn markers).
    completion_mask: list[int] = field(default_factory=list)
    conversation: list[dict[str, str]] = field(default_factory=list)  # the turns after the prompt
    tool_calls: int = 0
    tool_errors: int = 0

    @property
    def model_mask(self) -> list[int]:
        """1 per completion token the model sampled (all of them in a single-turn rollout)."""
        return self.completion_mask or [1] * len(self.completion_ids)


@dataclass
class Batch:
    """Padded tensors for the learner. Position t of the [N, T-1] tensors scores token t+1."""

    input_ids: torch.Tensor  # [N, T] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [N, T] 1 on real tokens
    loss_mask: torch.Tensor  # [N, T-1] 1 where the target token is a completion token
    old_logprobs: torch.Tensor  # [N, T-1] sampler logprobs of the targets (0 off the mask)
    advantages: torch.Tensor  # [N]
    prompt_lens: torch.Tensor  # [N] prompt tokens at the start of each row
    groups: torch.Tensor  # [N] rows of one group are adjacent, share their prompt, and carry one id

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | slice) -> Batch:
        return Batch(*(getattr(self, f.name)[rows] for f in fields(self)))
