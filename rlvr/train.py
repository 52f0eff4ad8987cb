"""The RL loop, top to bottom: sample prompts -> generate groups -> score -> advantages -> learn
-> sync weights into the engine (and check them) -> log.

Where this departs from the GRPO paper (Shao et al. 2024):
- The "old" policy of the clipped ratio is the sampler's own logprobs (from vLLM), as in
  DAPO/verl with one update per batch; the ratio is 1 up to engine/learner numerical
  mismatch, which is logged every step (mismatch/*).
- Loss aggregation defaults to a token mean over the whole batch (DAPO); the paper's
  per-sequence mean is `algorithm.loss_agg=seq_mean_token_mean`.
- Sequences whose advantage is 0 are not run through the learner when there is no KL term
  (their gradient is exactly 0); they still count in the loss normaliser.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from rlvr import models
from rlvr.algorithms import advantages
from rlvr.config import check
from rlvr.learner import Learner, make_batch
from rlvr.logging import Logger, manifest
from rlvr.rewards import Rewards
from rlvr.rollout.engine import RolloutEngine, check_canary
from rlvr.types import Prompt, Rollout

log = logging.getLogger("rlvr")

CANARY_ANSWER = " <answer>42</answer>"


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but torch sees no GPU (is the CPU build of torch installed?)")
    return name


def render(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt through the model's chat template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def summarise(rollouts: list[Rollout], rewards: Rewards, prefix: str = "") -> dict[str, float]:
    """Mean reward (total and per term), accuracy, completion length and truncation rate."""
    n = len(rollouts)
    out = {f"{prefix}reward/mean": sum(r.reward for r in rollouts) / n}
    for name in rewards.fns:
        out[f"{prefix}reward/{name}"] = sum(r.rewards[name] for r in rollouts) / n
    out[f"{prefix}accuracy"] = sum(rewards.is_correct(r) for r in rollouts) / n
    out[f"{prefix}completion_len/mean"] = sum(len(r.completion_ids) for r in rollouts) / n
    out[f"{prefix}truncated_frac"] = sum(r.finish_reason == "length" for r in rollouts) / n
    return out


def evaluate(engine: RolloutEngine, tokenizer, prompts: list[Prompt], rewards: Rewards) -> dict[str, float]:
    """Greedy decoding on the held-out prompts."""
    rollouts = engine.generate(prompts, [render(tokenizer, p) for p in prompts], n=1, seed=0, greedy=True)
    rewards.score(rollouts)
    return summarise(rollouts, rewards, prefix="eval/")


def train(cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    """Run `cfg.trainer.max_steps` RL steps; return the last step's metrics (and the final eval)."""
    # Everything that can fail on bad input fails here, before a model loads.
    check(cfg)
    task = instantiate(cfg.data, seed=cfg.seed, _convert_="all")
    rewards = Rewards(cfg.reward)
    device = pick_device(cfg.trainer.device)
    if cfg.trainer.num_threads is not None:  # before the engine starts: vLLM pins its threads
        torch.set_num_threads(cfg.trainer.num_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model_path = models.resolve(cfg.model)

    logger = Logger(run_dir, cfg, cfg.trainer.max_steps)
    logger.write_manifest(manifest(cfg, model_path, device))
    learner = Learner(model_path, cfg.model, cfg.optim, cfg.algorithm, cfg.trainer,
                      cfg.rollout.temperature, cfg.rollout.max_tokens, device)
    tok = learner.tokenizer
    engine = RolloutEngine(model_path, cfg.rollout, cfg.model.dtype, cfg.seed, device, Path(cfg.cache_dir))
    eval_prompts = task.eval_prompts()
    # A fixed sequence whose logprobs engine and learner must agree on after every sync.
    canary = render(tok, eval_prompts[0]) + tok(CANARY_ANSWER, add_special_tokens=False).input_ids
    try:
        check_canary(engine, learner.sequence_logprobs(canary), canary, cfg.rollout.canary_tol)
        first_eval = evaluate(engine, tok, eval_prompts, rewards)
        logger.log(0, first_eval)
        metrics: dict[str, float] = {}
        G = cfg.algorithm.group_size
        for step in range(1, cfg.trainer.max_steps + 1):
            t_step = time.perf_counter()

            # 1. prompts, 2. a group of G completions per prompt
            prompts = task.sample(cfg.data.batch_size)
            t0 = time.perf_counter()
            rollouts = engine.generate(prompts, [render(tok, p) for p in prompts], n=G,
                                       seed=cfg.seed * 1_000_003 + step * 10_007)
            t_rollout = time.perf_counter() - t0

            # 3. rewards, 4. group-relative advantages
            t0 = time.perf_counter()
            rewards.score(rollouts)
            t_reward = time.perf_counter() - t0
            scores = torch.tensor([r.reward for r in rollouts]).view(len(prompts), G)  # [P, G]
            adv = advantages.compute(scores, cfg.algorithm.advantage, cfg.algorithm.adv_eps)  # [P, G]

            # 5. one policy update
            t0 = time.perf_counter()
            learn = learner.step(make_batch(rollouts, adv.flatten().tolist(), learner.pad_id))
            t_learn = time.perf_counter() - t0

            # 6. new weights into the engine, then prove it serves them
            t0 = time.perf_counter()
            engine.load_weights(learner.named_weights())
            t_sync = time.perf_counter() - t0
            canary_diff = check_canary(engine, learner.sequence_logprobs(canary), canary, cfg.rollout.canary_tol)

            # 7. log
            metrics = summarise(rollouts, rewards)
            metrics.update(task.metrics())  # the curriculum level these prompts came from
            task.update(metrics["accuracy"])
            generated = sum(len(r.completion_ids) for r in rollouts)
            metrics.update(learn)
            metrics.update({
                "reward/std": float(scores.std()),
                "reward/errors": float(rewards.errors),
                "groups/zero_adv_frac": float((scores.std(dim=1) == 0).float().mean()),
                "sync/logprob_max_diff": canary_diff,
                "time/rollout_s": t_rollout,
                "time/reward_s": t_reward,
                "time/learn_s": t_learn,
                "time/sync_s": t_sync,
                "time/step_s": time.perf_counter() - t_step,
                "tokens_per_s": generated / t_rollout,
            })
            logger.log(step, metrics)
            if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step < cfg.trainer.max_steps:
                logger.log(step, evaluate(engine, tok, eval_prompts, rewards))
            for r in rollouts[: cfg.trainer.log_samples]:
                log.info("sample (reward %.2f, answer %s): %r", r.reward, r.prompt.answer, r.text[:300])

        final_eval = evaluate(engine, tok, eval_prompts, rewards)
        logger.log(cfg.trainer.max_steps, final_eval)
        log.info("eval accuracy %.3f -> %.3f over %d steps", first_eval["eval/accuracy"],
                 final_eval["eval/accuracy"], cfg.trainer.max_steps)
        if cfg.trainer.save_model:
            models.build_atomically(run_dir / "model", learner.save)
            log.info("final model: %s", run_dir / "model")
        return {**metrics, **final_eval}
    finally:
        engine.close()
        logger.close()
