"""What a training step records: the typed `StepMetrics` of the loop, and the summaries of a set of
rollouts that it and the evaluations share. Everything goes to metrics.jsonl as flat `name: value`
pairs; the names are those the curves (rlvr.plot) and the console line (rlvr.runlog) read."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field, fields

import torch

from rlvr.records import Rollout
from rlvr.rewards import Rewards


def summarise(rollouts: list[Rollout], rewards: Rewards, prefix: str = "") -> dict[str, float]:
    """Mean reward (total and per term), accuracy (also per `meta["level"]` when prompts carry
    several, and per `meta["domain"]` as `<domain>/accuracy`), completion length and truncation rate."""
    n = len(rollouts)
    out = {f"{prefix}reward/mean": sum(r.reward for r in rollouts) / n}
    for name in rewards.weights:  # (a mixture's terms: over the rollouts of their source)
        values = [r.rewards[name] for r in rollouts if name in r.rewards]
        if values:
            out[f"{prefix}reward/{name}"] = sum(values) / len(values)
    out[f"{prefix}accuracy"] = sum(rewards.is_correct(r) for r in rollouts) / n
    # a task whose prompts carry several meta["level"]s (a curriculum) or meta["domain"]s (sources, e.g. BFCL's
    # categories): accuracy per level and per source too
    for level, accuracy in _accuracy_by("level", rollouts, rewards).items():
        out[f"{prefix}accuracy/{level}"] = accuracy
    for domain, accuracy in _accuracy_by("domain", rollouts, rewards).items():
        out[f"{prefix}{domain}/accuracy"] = accuracy
    out[f"{prefix}completion_len/mean"] = sum(sum(r.model_mask) for r in rollouts) / n  # the model's own tokens
    out[f"{prefix}truncated_frac"] = sum(r.finish_reason == "length" for r in rollouts) / n
    if rollouts[0].conversation:  # multi-turn rollouts with tools
        out[f"{prefix}tools/turns"] = sum(sum(m["role"] == "assistant" for m in r.conversation) for r in rollouts) / n
        out[f"{prefix}tools/calls"] = sum(r.tool_calls for r in rollouts) / n
        out[f"{prefix}tools/errors"] = sum(r.tool_errors for r in rollouts) / n
        out[f"{prefix}tools/call_frac"] = sum(r.tool_calls > 0 for r in rollouts) / n  # rollouts calling a tool
        out[f"{prefix}tokens/model"] = out[f"{prefix}completion_len/mean"]
        out[f"{prefix}tokens/tool"] = sum(len(r.completion_mask) - sum(r.completion_mask) for r in rollouts) / n
    return out


def _accuracy_by(key: str, rollouts: list[Rollout], rewards: Rewards) -> dict[str, float]:
    """Accuracy per value of `prompt.meta[key]`, sorted; empty unless the prompts carry two values or more."""
    groups: dict[str, list[bool]] = {}
    for r in rollouts:
        if key in r.prompt.meta:
            groups.setdefault(str(r.prompt.meta[key]), []).append(rewards.is_correct(r))
    return {value: sum(c) / len(c) for value, c in sorted(groups.items())} if len(groups) > 1 else {}


def sample_record(r: Rollout, rewards: Rewards, **extra) -> dict:
    """One completion as a JSON-ready record, with its reward components."""
    return {**extra, **{k: r.prompt.meta[k] for k in ("id", "domain") if k in r.prompt.meta},
            "messages": r.prompt.messages, "answer": r.prompt.answer, "completion": r.text,
            "rewards": r.rewards, "reward": r.reward, "correct": rewards.is_correct(r),
            "finish_reason": r.finish_reason, "tokens": len(r.completion_ids),
            **({"conversation": r.conversation, "tool_calls": r.tool_calls, "tool_errors": r.tool_errors}
               if r.conversation else {}),
            **({"reward_errors": r.reward_errors} if r.reward_errors else {})}


def peak_memory(device: str) -> dict[str, float]:
    """Peak memory so far: the process's resident set (GiB), and on CUDA the most torch allocated."""
    unit = 2**30 if sys.platform == "darwin" else 2**20  # ru_maxrss is in bytes on macOS, KiB on Linux
    out = {"memory/rss_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / unit}
    if device == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


@dataclass
class StepTimes:
    """Seconds of each phase of a step; `step` is the whole step, the others its parts (what none of
    them holds, the step's bookkeeping, is logged as time/other_s)."""

    prompts: float = 0.0  # drawing prompts and fitting them to the context (every round of dynamic sampling)
    rollout: float = 0.0  # generation (every round)
    reward: float = 0.0  # scoring and shaping (every round)
    learn: float = 0.0  # the policy update
    sync: float = 0.0  # weights into the engine
    canary: float = 0.0  # the check that the engine serves them
    step: float = 0.0

    def named(self) -> dict[str, float]:
        """The phases, by name (every field but `step`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "step"}


@dataclass
class StepMetrics:
    """One RL step's record. The policy's figures are of the first sampling round (an unfiltered
    sample of the policy, whatever dynamic sampling kept); the learner's of what it trained on."""

    policy: dict[str, float]  # `summarise` of the first round: reward/*, accuracy, completion length...
    task: dict[str, float]  # the task's own (the curriculum level the prompts came from)
    learn: dict[str, float]  # Learner.step's: loss, kl, clip_frac, grad_norm, lr, learn/*, mismatch/*
    shaping: dict[str, float]  # overlong punishment, KL in the reward
    reward_std: float
    entropy: float  # mean -log p of the sampled tokens: an unbiased estimate of the sampling entropy
    reward_errors: int  # reward calls that failed this step
    zero_adv_frac: float  # groups of the first round whose shaped scores are all equal: no signal
    groups_trained: int
    extra_rounds: int  # dynamic sampling's extra rounds
    dropped_prompts: int  # prompts too long for the context
    discarded: int  # rollouts generated and not trained on (dynamic sampling's flat groups)
    canary_diff: float  # the largest engine/learner logprob difference after the sync
    times: StepTimes
    tokens: int  # tokens generated
    memory: dict[str, float] = field(default_factory=dict)  # peak memory so far (the largest rank's)

    def flat(self) -> dict[str, float]:
        """The record as metrics.jsonl holds it (the loop adds the DegenerationMonitor's flags)."""
        t = self.times
        return {
            **self.policy, **self.task, **self.learn, **self.shaping,
            "reward/std": self.reward_std,
            "entropy/sampled": self.entropy,
            "reward/errors": float(self.reward_errors),
            "groups/zero_adv_frac": self.zero_adv_frac,
            "groups/trained": float(self.groups_trained),
            "groups/extra_rounds": float(self.extra_rounds),
            "data/dropped_prompts": float(self.dropped_prompts),
            "rollouts/discarded": float(self.discarded),
            "sync/logprob_max_diff": self.canary_diff,
            **{f"time/{phase}_s": seconds for phase, seconds in t.named().items()},
            "time/other_s": t.step - sum(t.named().values()),
            "time/step_s": t.step,
            "tokens_per_s": self.tokens / t.rollout if t.rollout else 0.0,
            **self.memory,
        }
