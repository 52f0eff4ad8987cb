"""Evaluation on a task's held-out prompts: greedy accuracy (before, during and after training) and,
for the `rlvr eval` command (`run_eval`), sampled pass@k / mean@k with every sample written out."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlvr.config import TrainConfig
from rlvr.metrics import sample_record, summarise
from rlvr.records import Prompt, Rollout
from rlvr.rewards import Rewards

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


def run_eval(cfg: TrainConfig, run_dir: Path) -> dict[str, float]:
    """`rlvr eval`: the model of `cfg.model` on the task's held-out prompts. Writes eval.json and
    eval_samples.jsonl into `run_dir` and prints a table."""
    from rlvr.run import build

    if cfg.launch.nproc_per_node * cfg.launch.nnodes > 1:
        log.warning("rlvr eval runs in one process: launch.nproc_per_node=%d and launch.nnodes=%d are for rlvr train",
                    cfg.launch.nproc_per_node, cfg.launch.nnodes)
    start = time.perf_counter()
    run = build(cfg, run_dir, training=False)
    prompts, rewards = run.eval_prompts, run.rewards
    try:
        metrics, greedy_rollouts = greedy(run.generate, prompts, run.eval_ids, rewards)
        sampled_rollouts: list[Rollout] = []
        if cfg.eval.n_samples > 0:
            more, sampled_rollouts = sampled(run.generate, prompts, run.eval_ids, rewards, cfg.eval.n_samples,
                                             list(cfg.eval.ks), cfg.seed)
            metrics.update(more)
    finally:
        run.close()
    metrics = {"model_path": str(run.model_path), "prompts": len(prompts), "wall_s": time.perf_counter() - start,
               **metrics}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n")
    with open(run_dir / "eval_samples.jsonl", "w") as f:
        for r in greedy_rollouts:
            f.write(json.dumps(sample_record(r, rewards, decoding="greedy")) + "\n")
        for r in sampled_rollouts:
            f.write(json.dumps(sample_record(r, rewards, decoding="sampled")) + "\n")
    table = Table(title=f"rlvr eval: {run.model_path} ({len(prompts)} held-out prompts)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if isinstance(value, float) and key != "wall_s":
            table.add_row(key, f"{value:.4f}")
    Console().print(table)
    log.info("wrote %s and %s", run_dir / "eval.json", run_dir / "eval_samples.jsonl")
    return metrics
