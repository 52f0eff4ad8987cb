"""Evaluation on a task's held-out prompts: greedy accuracy (also during training) and, for
`rlvr eval`, sampled pass@k / mean@k with every sample written out."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from rlvr import models
from rlvr.config import check
from rlvr.data import build_task
from rlvr.precision import pick_device
from rlvr.precision import resolve as resolve_precision
from rlvr.prompts import PromptFit
from rlvr.rewards import Rewards
from rlvr.types import Prompt, Rollout

log = logging.getLogger("rlvr")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, arXiv:2107.03374, Eq. 1):
    1 - C(n - c, k) / C(n, k), computed as a stable product.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4), pass_at_k(4, 3, 2)
    (0.25, 0.5, 0.0, 1.0)
    """
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def summarise(rollouts: list[Rollout], rewards: Rewards, prefix: str = "") -> dict[str, float]:
    """Mean reward (total and per term), accuracy (also per `meta["level"]` when prompts carry
    several), completion length and truncation rate."""
    n = len(rollouts)
    out = {f"{prefix}reward/mean": sum(r.reward for r in rollouts) / n}
    for name in rewards.weights:
        out[f"{prefix}reward/{name}"] = sum(r.rewards[name] for r in rollouts) / n
    out[f"{prefix}accuracy"] = sum(rewards.is_correct(r) for r in rollouts) / n
    levels: dict[str, list[bool]] = {}
    for r in rollouts:
        if "level" in r.prompt.meta:
            levels.setdefault(str(r.prompt.meta["level"]), []).append(rewards.is_correct(r))
    if len(levels) > 1:  # a task whose prompts carry meta["level"]: accuracy per level too
        for level, correct in sorted(levels.items()):
            out[f"{prefix}accuracy/{level}"] = sum(correct) / len(correct)
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


def greedy(generate, prompts: list[Prompt], prompt_ids: list[list[int]],
           rewards: Rewards) -> tuple[dict[str, float], list[Rollout]]:
    """Greedy decoding on `prompts` (token ids `prompt_ids`) by `generate` (`Engine.generate`'s
    signature): (eval/… metrics, the scored rollouts)."""
    rollouts = generate(prompts, prompt_ids, n=1, seed=0, greedy=True, context="in the greedy evaluation")
    rewards.score(rollouts)
    return summarise(rollouts, rewards, prefix="eval/"), rollouts


def sampled(generate, prompts: list[Prompt], prompt_ids: list[list[int]], rewards: Rewards, n: int, ks: list[int],
            seed: int) -> tuple[dict[str, float], list[Rollout]]:
    """`n` samples per prompt at the rollout temperature: pass@k for each k <= n, and mean@n
    (the share of all samples that are correct)."""
    rollouts = generate(prompts, prompt_ids, n=n, seed=seed, context="in the sampled evaluation")
    rewards.score(rollouts)
    correct = [sum(rewards.is_correct(r) for r in rollouts[i * n : (i + 1) * n]) for i in range(len(prompts))]
    out = summarise(rollouts, rewards, prefix="eval_sampled/")
    for k in ks:
        if k <= n:
            out[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(prompts)
    out[f"eval/mean@{n}"] = sum(correct) / (n * len(prompts))
    return out, rollouts


def sample_record(r: Rollout, rewards: Rewards, **extra) -> dict:
    """One completion as a JSON-ready record, with its reward components."""
    return {**extra, "messages": r.prompt.messages, "answer": r.prompt.answer, "completion": r.text,
            "rewards": r.rewards, "reward": r.reward, "correct": rewards.is_correct(r),
            "finish_reason": r.finish_reason, "tokens": len(r.completion_ids),
            **({"conversation": r.conversation, "tool_calls": r.tool_calls, "tool_errors": r.tool_errors}
               if r.conversation else {}),
            **({"reward_errors": r.reward_errors} if r.reward_errors else {})}


def run_eval(cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    """`rlvr eval`: the model of `cfg.model` on the task's held-out prompts. Writes eval.json and
    eval_samples.jsonl into `run_dir` and prints a table."""
    from transformers import AutoTokenizer

    from rlvr.rollout.engine import build_engine, check_backend, check_memory
    from rlvr.rollout.multiturn import build_tools, rollout_generator

    check(cfg, training=False)
    if cfg.trainer.nproc_per_node * cfg.trainer.nnodes > 1:
        log.warning("rlvr eval runs in one process: trainer.nproc_per_node=%d and trainer.nnodes=%d are for rlvr train",
                    cfg.trainer.nproc_per_node, cfg.trainer.nnodes)
    device = pick_device(cfg.trainer.device)
    check_backend(cfg.rollout.backend, device)
    rewards = Rewards(cfg.reward, device)
    tools = build_tools(cfg)
    model_path = models.resolve(cfg.model, Path(cfg.cache_dir))
    task = build_task(cfg, model_path)
    precision = resolve_precision(cfg.trainer.precision, cfg.rollout.dtype, cfg.rollout.canary_tol, device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts, prompt_ids = PromptFit(tokenizer, cfg.rollout.max_model_len, cfg.rollout.max_tokens,
                                    tools).eval_prompts(task.eval_prompts())
    start = time.perf_counter()
    check_memory(cfg.rollout, model_path, precision.engine_dtype, device)
    engine = build_engine(model_path, cfg.rollout, precision.engine_dtype, cfg.seed, device, Path(cfg.cache_dir))
    generate = rollout_generator(engine, tokenizer, tools, cfg.rollout)
    rewards.attach(engine, tokenizer)
    try:
        metrics, greedy_rollouts = greedy(generate, prompts, prompt_ids, rewards)
        sampled_rollouts: list[Rollout] = []
        if cfg.eval.n_samples > 0:
            more, sampled_rollouts = sampled(generate, prompts, prompt_ids, rewards, cfg.eval.n_samples,
                                             list(cfg.eval.ks), cfg.seed)
            metrics.update(more)
    finally:
        rewards.close()
        engine.close()
    metrics = {"model_path": str(model_path), "prompts": len(prompts), "wall_s": time.perf_counter() - start,
               **metrics}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n")
    with open(run_dir / "eval_samples.jsonl", "w") as f:
        for r in greedy_rollouts:
            f.write(json.dumps(sample_record(r, rewards, decoding="greedy")) + "\n")
        for r in sampled_rollouts:
            f.write(json.dumps(sample_record(r, rewards, decoding="sampled")) + "\n")
    table = Table(title=f"rlvr eval: {model_path} ({len(prompts)} held-out prompts)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if isinstance(value, float) and key != "wall_s":
            table.add_row(key, f"{value:.4f}")
    Console().print(table)
    log.info("wrote %s and %s", run_dir / "eval.json", run_dir / "eval_samples.jsonl")
    return metrics
