"""The RL loop, top to bottom: sample prompts -> generate groups -> score -> advantages -> learn
-> sync weights into the engine (and check them) -> log.

Where this departs from the GRPO paper (Shao et al. 2024):
- The "old" policy of the clipped ratio is the sampler's own logprobs (from the engine), as in
  DAPO/verl with one update per batch; the ratio is 1 up to engine/learner numerical
  mismatch, which is logged every step the learner runs (mismatch/*). The GSPO preset (and any run
  with `algorithm.tis_cap`) takes the learner's own logprobs before the update instead, with TIS.
- Loss aggregation defaults to a token mean over the whole batch (DAPO); the paper's
  per-sequence mean is `algorithm.loss_agg=seq_mean_token_mean`.
- Sequences whose advantage is 0 are not run through the learner when there is no KL term
  (their gradient is exactly 0); they still count in the loss normaliser. A group whose scores are
  equal up to float rounding gets advantage exactly 0 (rlvr.algorithms.advantages.flat_groups).
- DAPO's dynamic sampling draws a whole new batch of prompts per extra round and stops after
  `max_rounds`, training on the groups it has, instead of looping until the batch is full.
- Reward and accuracy are logged for the first round of prompts (an unfiltered sample of the
  policy), whatever dynamic sampling then keeps.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from rlvr import checkpoint, distributed, models
from rlvr.algorithms import advantages
from rlvr.algorithms.losses import kl_penalty, overlong_penalty
from rlvr.config import check
from rlvr.data import Task, build_task
from rlvr.errors import RlvrError
from rlvr.evaluate import greedy, sample_record, summarise
from rlvr.host import keep_freed_memory
from rlvr.learner import Learner, make_batch
from rlvr.logging import Logger, NullLogger, manifest
from rlvr.monitor import DegenerationMonitor
from rlvr.plot import plot
from rlvr.precision import pick_device
from rlvr.precision import resolve as resolve_precision
from rlvr.prompts import PromptFit
from rlvr.rewards import Rewards
from rlvr.rollout.engine import Canary, build_engine, canary_sequence, check_backend, check_memory
from rlvr.rollout.multiturn import Generate, build_tools, rollout_generator
from rlvr.types import Rollout

log = logging.getLogger("rlvr")

CANARY_ANSWER = " <answer>42</answer>"


class TrainingError(RlvrError, RuntimeError):
    """The run cannot go on (e.g. updates keep failing); the message says what is left on disk."""


class GracefulStop:
    """Once installed, SIGINT / SIGTERM ask the loop to stop after the current step (a second
    signal stops at once); `restore` puts the previous handlers back."""

    MESSAGE = "%s: finishing this step, then writing a checkpoint (send it again to stop at once)"

    def __init__(self) -> None:
        self.signal: int | None = None
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        log.warning(self.MESSAGE, signal.Signals(signum).name)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def prepare_run_dir(run_dir: Path, resume: Path | None, overwrite: bool, auto_resume: bool = False) -> None:
    """Refuse a run dir that holds another run (unless resuming or told to overwrite); on resume,
    put back the metrics of the checkpoint (steps after it will be run again). `auto_resume`: the
    user asked for trainer.resume=auto and the run dir holds no checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    if resume is not None:
        tmp = metrics.with_suffix(".jsonl.tmp")
        shutil.copyfile(resume / "metrics.jsonl", tmp)
        os.replace(tmp, metrics)
    elif metrics.exists():
        if not overwrite and auto_resume:
            raise TrainingError(
                f"trainer.resume=auto: {run_dir} holds a run (metrics.jsonl) but no complete checkpoint to resume "
                "from (checkpoints are written every trainer.save_every steps; 0 writes none). Start over with "
                "trainer.overwrite=true, or choose another hydra.run.dir.")
        if not overwrite:
            raise TrainingError(
                f"{run_dir} already holds a run (metrics.jsonl). Continue it with trainer.resume=auto, "
                "start over with trainer.overwrite=true, or choose another hydra.run.dir.")
        for name in ("metrics.jsonl", "samples.jsonl", "summary.json", "curves.png"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # resume=auto must not find the old run's


@dataclass
class Collected:
    """What one step generated and scored, as `collect_groups` returns it."""

    rollouts: list[Rollout]  # the groups to train on, flattened: [K * G]
    scores: torch.Tensor  # [K, G] shaped scores of those groups: what the advantages see
    first_round: list[Rollout]  # the first round's rollouts, an unfiltered sample of the policy: [P * G]
    first_scores: torch.Tensor  # [P, G] their shaped scores
    shaping: dict[str, float]  # metrics of the shaping, first round
    times: dict[str, float]  # rollout and reward seconds, generated tokens
    rounds: int  # extra rounds of dynamic sampling
    dropped: int  # training prompts dropped as too long for the context


def collect_groups(task: Task, fit: PromptFit, generate: Generate, rewards: Rewards,
                   score: Callable[[list[Rollout]], tuple[torch.Tensor, dict[str, float]]],
                   cfg: DictConfig, step: int) -> Collected:
    """Sample `data.batch_size` prompts that fit the context, generate a group for each (`generate`:
    the engine's, or multi-turn with tools), score it and shape the scores (`score`).

    With DAPO's dynamic sampling, groups whose shaped scores are all equal (advantage 0: no signal)
    are dropped and another `batch_size` prompts drawn, for at most `max_rounds` extra rounds; when the
    bound is hit the step trains on the groups it has (possibly fewer, logged as groups/trained).
    """
    P, G = cfg.data.batch_size, cfg.algorithm.group_size
    dynamic = cfg.algorithm.dynamic_sampling
    kept: list[tuple[list[Rollout], torch.Tensor]] = []
    times = {"rollout": 0.0, "reward": 0.0, "tokens": 0}
    dropped = 0
    first: tuple[list[Rollout], torch.Tensor, dict[str, float]] | None = None
    for round_ in range(1 + (dynamic.max_rounds if dynamic.enabled else 0)):
        prompts, prompt_ids, too_long = fit.sample(task, P)
        dropped += too_long
        # Seeds depend only on (seed, step, round): a step's samples repeat exactly for a seed.
        seed = random.Random(f"{cfg.seed}-{step}-{round_}").randrange(2**31 - 2**20)
        t0 = time.perf_counter()
        rollouts = generate(prompts, prompt_ids, n=G, seed=seed, context=f"at step {step}")
        times["rollout"] += time.perf_counter() - t0
        times["tokens"] += sum(sum(r.model_mask) for r in rollouts)
        t0 = time.perf_counter()
        rewards.score(rollouts)
        scores, shaping = score(rollouts)  # [P, G]
        times["reward"] += time.perf_counter() - t0
        if first is None:
            first = rollouts, scores, shaping
        if not dynamic.enabled:
            return Collected(rollouts, scores, *first, times, 0, dropped)
        signal_ = ~advantages.flat_groups(scores)  # [P]
        kept += [(rollouts[i * G : (i + 1) * G], scores[i]) for i in range(P) if signal_[i]]
        if len(kept) >= P:
            break
    else:
        if kept:
            log.warning("dynamic sampling: %d of %d groups carry a signal after %d extra rounds; training on those",
                        len(kept), P, dynamic.max_rounds)
        else:
            log.warning("dynamic sampling: no group carries a signal after %d extra rounds; this step changes "
                        "nothing", dynamic.max_rounds)
            return Collected(rollouts, scores, *first, times, round_, dropped)
    kept = kept[:P]
    return Collected([r for g, _ in kept for r in g], torch.stack([s for _, s in kept]), *first, times, round_,
                     dropped)


def shaped_scores(rollouts: list[Rollout], rewards: Rewards, learner: Learner,
                  cfg: DictConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores [P, G] for the advantages: the reward terms combined (reward.combine), plus DAPO's soft
    overlong punishment and a KL penalty to the reference model when configured. Returns (scores,
    metrics of the shaping)."""
    a = cfg.algorithm
    scores = rewards.scores(rollouts, a.group_size).flatten()  # [N]
    metrics = {}
    if a.overlong.mode == "soft":
        penalty = overlong_penalty(torch.tensor([len(r.completion_ids) for r in rollouts]),
                                   cfg.rollout.max_tokens, a.overlong.buffer)
        scores = scores + penalty
        metrics["reward/overlong"] = float(penalty.mean())
    if a.kl.reward_coef > 0:
        batch = make_batch(rollouts, learner.pad_id, mask_truncated=a.overlong.mode == "mask")
        ref = learner.batch_logprobs(batch, reference=True)  # [N, T-1]
        kl = kl_penalty(batch.old_logprobs, ref, batch.loss_mask, a.kl.estimator).sum(dim=1)  # [N]
        scores = scores - a.kl.reward_coef * kl
        metrics["kl_reward"] = float(kl.mean())
    return scores.view(-1, a.group_size), metrics


def peak_memory(device: str) -> dict[str, float]:
    """Peak memory so far: the process's resident set (GiB), and on CUDA the most torch allocated."""
    unit = 2**30 if sys.platform == "darwin" else 2**20  # ru_maxrss is in bytes on macOS, KiB on Linux
    out = {"memory/rss_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / unit}
    if device == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def train(cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    """Run `cfg.trainer.max_steps` RL steps; return the last step's metrics (and the final eval).

    Across processes every rank runs this whole function (rlvr.distributed: rollouts split and shared,
    the learner sharded); rank 0 alone writes into `run_dir`."""
    t_start = time.perf_counter()
    # Everything that can fail on bad input fails here, before a model loads.
    check(cfg)
    device = pick_device(cfg.trainer.device)
    check_backend(cfg.rollout.backend, device)
    rewards = Rewards(cfg.reward, device)
    tools = build_tools(cfg)
    model_path = models.resolve(cfg.model, Path(cfg.cache_dir))
    task = build_task(cfg, model_path)
    precision = resolve_precision(cfg.trainer.precision, cfg.rollout.dtype, cfg.rollout.canary_tol, device)
    log.info("device %s (trainer.device=%s), %s engine; precision: learner %s, engine %s, canary tolerance %g (%s)",
             device, cfg.trainer.device, cfg.rollout.backend, precision.learner, precision.engine_dtype,
             precision.canary_tol, precision.why)
    check_memory(cfg.rollout, model_path, precision.engine_dtype, device)
    if cfg.trainer.num_threads is not None:  # before the engine starts: vLLM pins its threads
        torch.set_num_threads(cfg.trainer.num_threads)
    if keep_freed_memory():  # each step's big tensors reuse the last step's pages instead of faulting in new ones
        log.info("malloc keeps freed memory for reuse (no page faults for each step's tensors; resident memory "
                 "stays at its peak)")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    resume = checkpoint.find(cfg.trainer.resume, run_dir)
    policy_path = resume / "model" if resume else model_path  # a resumed run starts from the checkpoint
    lora = cfg.model.lora if cfg.model.lora.r > 0 else None
    # With LoRA the learner is the base model plus the adapter (the checkpoint's); the engine serves merged weights.
    learner = Learner(model_path if lora else policy_path, cfg.optim, cfg.algorithm, cfg.trainer,
                      cfg.rollout.temperature, cfg.rollout.max_tokens, device, precision, reference_path=model_path,
                      lora=lora, adapter_path=checkpoint.adapter(resume, lora is not None) if resume else None)
    tok = learner.tokenizer
    # Every prompt is checked against the engine's context before the engine starts.
    fit = PromptFit(tok, cfg.rollout.max_model_len, cfg.rollout.max_tokens, tools)
    eval_prompts, eval_ids = fit.eval_prompts(task.eval_prompts())
    fit.probe(task, cfg.data.batch_size)
    rank0 = distributed.rank() == 0

    def start_run_dir() -> None:  # the first write into the run dir
        run_dir.mkdir(parents=True, exist_ok=True)
        prepare_run_dir(run_dir, resume, cfg.trainer.overwrite, auto_resume=cfg.trainer.resume == "auto")

    distributed.on_rank0(start_run_dir)  # every rank stops alike if the run dir is refused
    logger = Logger(run_dir, cfg, cfg.trainer.max_steps) if rank0 else NullLogger()
    logger.write_manifest({**manifest(cfg, model_path, device), "resumed_from": str(resume) if resume else None,
                           "shared_prefix": learner.shared_prefix, "compiled": learner.compiled,
                           "world_size": distributed.world_size(),
                           "precision": {"learner": precision.learner, "engine_dtype": precision.engine_dtype,
                                         "canary_tol": precision.canary_tol, "why": precision.why}})
    start = checkpoint.load_state(resume, learner, task, rewards) if resume else 0
    engine = build_engine(policy_path, cfg.rollout, precision.engine_dtype, cfg.seed, device, Path(cfg.cache_dir))
    engine_dtype = getattr(torch, precision.engine_dtype)
    # Across processes each rank generates its share of every call and all ranks get all the rollouts.
    generate = distributed.split(rollout_generator(engine, tok, tools, cfg.rollout))
    rewards.attach(engine, tok)  # a judge term without a model of its own asks the policy
    # A fixed sequence whose logprobs engine and learner must agree on after every sync.
    canary = Canary(canary_sequence(min(eval_ids, key=len), tok(CANARY_ANSWER, add_special_tokens=False).input_ids,
                                    engine.block_size(), cfg.rollout.max_model_len), precision.canary_tol)

    def score(rollouts: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
        return shaped_scores(rollouts, rewards, learner, cfg)

    def save_checkpoint(step: int) -> Path | None:
        return checkpoint.save_or_report(run_dir, step, learner, task, rewards, cfg.trainer.keep_last)

    monitor = DegenerationMonitor([t for t in rewards.weights if t != cfg.reward.correct_term])
    canary_warned = False
    stop = GracefulStop()
    try:
        canary.check(engine, learner.sequence_logprobs)
        if start == 0:
            first_eval = greedy(generate, eval_prompts, eval_ids, rewards)[0]
            logger.log(0, first_eval)
        else:
            log.info("resumed from %s at step %d", resume, start)
            first_eval = distributed.on_rank0(logger.first_record)
        metrics: dict[str, float] = {}
        bad_steps = 0
        for step in range(start + 1, cfg.trainer.max_steps + 1):
            t_step = time.perf_counter()

            errors_before = rewards.errors
            # 1-3. prompts -> a group of G completions each -> rewards -> shaped scores (DAPO: keep groups
            # whose scores differ)
            c = collect_groups(task, fit, generate, rewards, score, cfg, step)

            # 4. group-relative advantages; across processes each rank learns on its share of the groups
            adv = advantages.compute(c.scores, cfg.algorithm.advantage, cfg.algorithm.adv_eps)  # [K, G]
            first, last = distributed.share(len(adv))
            G = cfg.algorithm.group_size
            batch = make_batch(c.rollouts[first * G : last * G], learner.pad_id,
                               mask_truncated=cfg.algorithm.overlong.mode == "mask")
            batch.advantages = adv[first:last].flatten()

            # 5. policy update
            t0 = time.perf_counter()
            learn = learner.step(batch)
            t_learn = time.perf_counter() - t0

            # 6. new weights into the engine, then prove it serves them
            t0 = time.perf_counter()
            engine.load_weights(learner.named_weights(engine_dtype))
            t_sync = time.perf_counter() - t0
            canary_diff = canary.check(engine, learner.sequence_logprobs)

            # 7. log: reward and accuracy of the first round, an unfiltered sample of the policy
            metrics = summarise(c.first_round, rewards)
            metrics.update(task.metrics())  # the curriculum level these prompts came from
            task.update(metrics["accuracy"])
            metrics.update(learn)
            metrics.update(c.shaping)
            metrics.update({
                "reward/std": float(torch.tensor([r.reward for r in c.first_round]).std()),
                # mean -log p of the sampled tokens: an unbiased estimate of the sampling distribution's entropy
                "entropy/sampled": -sum(sum(r.sampler_logprobs) for r in c.first_round)
                / max(sum(sum(r.model_mask) for r in c.first_round), 1),
                "reward/errors": float(rewards.errors - errors_before),
                # groups of the first round whose shaped scores are all equal: advantage 0, no signal
                "groups/zero_adv_frac": float(advantages.flat_groups(c.first_scores).float().mean()),
                "groups/trained": float(len(c.rollouts) // cfg.algorithm.group_size),
                "groups/extra_rounds": float(c.rounds),
                "data/dropped_prompts": float(c.dropped),
                "sync/logprob_max_diff": canary_diff,
                "time/rollout_s": c.times["rollout"],
                "time/reward_s": c.times["reward"],
                "time/learn_s": t_learn,
                "time/sync_s": t_sync,
                "time/step_s": time.perf_counter() - t_step,
                "tokens_per_s": c.times["tokens"] / c.times["rollout"],
                **{k: distributed.global_max(v) for k, v in peak_memory(device).items()},  # the largest rank's
            })
            metrics.update(monitor.update(step, metrics))
            logger.log(step, metrics)
            if metrics["groups/zero_adv_frac"] == 1.0 and not cfg.algorithm.dynamic_sampling.enabled:
                log.warning("step %d: every group's rewards were all equal: no learning signal this step", step)
            # Half the tolerance is above every honest difference measured (float32: 7e-5 of 1e-3; bfloat16:
            # up to 0.99 of 2.0, so a tenth, 0.2, was passed in nearly every bf16 run). Said once.
            if canary_diff > 0.5 * precision.canary_tol and not canary_warned:
                canary_warned = True
                log.warning("step %d: engine/learner canary difference %.2g is above half the canary tolerance %g, "
                            "more than any honest difference measured (rollout.canary_tol; said once, "
                            "sync/logprob_max_diff has every step's)", step, canary_diff, precision.canary_tol)
            if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step < cfg.trainer.max_steps:
                logger.log(step, greedy(generate, eval_prompts, eval_ids, rewards)[0])
            if cfg.trainer.log_samples:
                r = c.first_round[0]
                log.info("sample (reward %.2f, answer %s): %r", r.reward, r.prompt.answer, r.text[:300])
            if cfg.trainer.samples_every and step % cfg.trainer.samples_every == 0:
                logger.samples(step, [sample_record(r, rewards, step=step) for r in
                                      c.rollouts[: cfg.trainer.log_samples * cfg.algorithm.group_size]])

            # A NaN/inf loss or gradient skips the update; too many in a row end the run.
            bad_steps = bad_steps + 1 if learn["learn/skipped_updates"] else 0
            if bad_steps >= cfg.trainer.max_bad_steps:
                done = checkpoint.complete_checkpoints(run_dir)
                raise TrainingError(
                    f"step {step}: the update was skipped {bad_steps} steps in a row (non-finite loss or gradient; "
                    f"trainer.max_bad_steps={cfg.trainer.max_bad_steps}). "
                    + (f"The last good checkpoint is {done[-1]}." if done else "No checkpoint was written."))
            saved = None
            if cfg.trainer.save_every and (step % cfg.trainer.save_every == 0 or step == cfg.trainer.max_steps):
                saved = save_checkpoint(step)
            stop.signal = int(distributed.global_max(float(stop.signal or 0))) or None  # all ranks stop alike
            if stop.signal is not None:
                saved = saved or save_checkpoint(step)
                log.warning("stopped after step %d by %s. Continue with the same command plus "
                            "trainer.resume=%s hydra.run.dir=%s", step, signal.Signals(stop.signal).name,
                            saved if saved else "auto", run_dir)
                raise SystemExit(128 + stop.signal)

        final_eval = greedy(generate, eval_prompts, eval_ids, rewards)[0]
        logger.log(cfg.trainer.max_steps, final_eval)
        logger.write_summary({"steps": cfg.trainer.max_steps, "wall_s": time.perf_counter() - t_start,
                              "first_eval": first_eval, "final_eval": final_eval, "last_step": metrics})
        log.info("eval accuracy %.3f -> %.3f over %d steps", first_eval["eval/accuracy"],
                 final_eval["eval/accuracy"], cfg.trainer.max_steps)
        if rank0:
            plot([run_dir], run_dir / "curves.png")
        if cfg.trainer.save_model:
            weights = learner.export_weights()  # every rank takes part; rank 0 writes
            distributed.on_rank0(lambda: models.build_atomically(run_dir / "model",
                                                                 lambda path: learner.save(path, weights), replace=True))
            log.info("final model: %s", run_dir / "model")
        return {**metrics, **final_eval}
    finally:
        stop.restore()
        rewards.close()
        engine.close()
        logger.close()
