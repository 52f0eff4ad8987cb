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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr import distributed
from rlvr.algorithms import advantages
from rlvr.algorithms.losses import kl_penalty, overlong_penalty
from rlvr.config import TrainConfig
from rlvr.data import Task
from rlvr.learner import Learner, make_batch
from rlvr.loop import Watch, run_steps, sync
from rlvr.metrics import StepMetrics, StepTimes, peak_memory, summarise
from rlvr.prompts import PromptFit
from rlvr.records import Rollout
from rlvr.rewards import Rewards
from rlvr.rollout.multiturn import Generate
from rlvr.run import Run, build

log = logging.getLogger("rlvr")


@dataclass
class Collected:
    """What one step generated and scored, as `collect_groups` returns it."""

    rollouts: list[Rollout]  # the groups to train on, flattened: [K * G]
    scores: torch.Tensor  # [K, G] shaped scores of those groups: what the advantages see
    first_round: list[Rollout]  # the first round's rollouts, an unfiltered sample of the policy: [P * G]
    first_scores: torch.Tensor  # [P, G] their shaped scores
    shaping: dict[str, float]  # metrics of the shaping, first round
    times: dict[str, float]  # prompts, rollout and reward seconds, generated tokens
    rounds: int  # extra rounds of dynamic sampling
    dropped: int  # training prompts dropped as too long for the context


def collect_groups(task: Task, fit: PromptFit, generate: Generate, rewards: Rewards,
                   score: Callable[[list[Rollout]], tuple[torch.Tensor, dict[str, float]]],
                   cfg: TrainConfig, step: int) -> Collected:
    """Sample `data.batch_size` prompts that fit the context, generate a group for each (`generate`:
    the engine's, or multi-turn with tools), score it and shape the scores (`score`).

    With DAPO's dynamic sampling, groups whose shaped scores are all equal (advantage 0: no signal)
    are dropped and another `batch_size` prompts drawn, for at most `max_rounds` extra rounds; when the
    bound is hit the step trains on the groups it has (possibly fewer, logged as groups/trained).
    """
    P, G = cfg.data.batch_size, cfg.algorithm.group_size
    dynamic = cfg.algorithm.dynamic_sampling
    kept: list[tuple[list[Rollout], torch.Tensor]] = []
    times = {"prompts": 0.0, "rollout": 0.0, "reward": 0.0, "tokens": 0}
    dropped = 0
    first: tuple[list[Rollout], torch.Tensor, dict[str, float]] | None = None
    for round_ in range(1 + (dynamic.max_rounds if dynamic.enabled else 0)):
        t0 = time.perf_counter()
        prompts, prompt_ids, too_long = fit.sample(task, P)
        times["prompts"] += time.perf_counter() - t0
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
        if observe := getattr(task, "observe", None):  # each group's pass rate (rlvr.data.Task), every round's
            observe(prompts, [sum(map(rewards.is_correct, rollouts[i * G : (i + 1) * G])) / G
                              for i in range(len(prompts))], step)
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
    kept = kept[:P]
    scores = torch.stack([s for _, s in kept]) if kept else first[1][:0]  # (none kept: [0, G], nothing trained)
    return Collected([r for g, _ in kept for r in g], scores, *first, times, round_, dropped)


def shaped_scores(rollouts: list[Rollout], rewards: Rewards, learner: Learner,
                  cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
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
        batch = make_batch(rollouts, learner.policy.pad_id, mask_truncated=a.overlong.mode == "mask")
        ref = learner.scorer.batch_logprobs(batch, reference=True)  # [N, T-1]
        kl = kl_penalty(batch.old_logprobs, ref, batch.loss_mask, a.kl.estimator).sum(dim=1)  # [N]
        scores = scores - a.kl.reward_coef * kl
        metrics["kl_reward"] = float(kl.mean())
    return scores.view(-1, a.group_size), metrics


def rl_step(run: Run, step: int, watch: Watch) -> dict[str, float]:
    """One RL step (`learn`), its record logged with the degeneration monitor's flags and checked by
    `watch`: the contract of every stage's step (rlvr.loop.run_steps)."""
    metrics, collected = learn(run, step)
    record = metrics.flat()
    record.update(watch.monitor.update(step, record))
    run.logger.log(step, record)
    watch.after(step, metrics, collected)
    return record


def learn(run: Run, step: int) -> tuple[StepMetrics, Collected]:
    """Prompts -> groups -> scores -> advantages -> update -> sync (checked) -> the step's metrics."""
    cfg, learner, rewards, a = run.cfg, run.learner, run.rewards, run.cfg.algorithm
    t_step = time.perf_counter()
    errors_before = rewards.errors

    # 1-3. prompts -> a group of G completions each -> rewards -> shaped scores (DAPO: keep groups whose
    # scores differ)
    c = collect_groups(run.task, run.fit, run.generate, rewards,
                       lambda rollouts: shaped_scores(rollouts, rewards, learner, cfg), cfg, step)

    # 4. group-relative advantages; across processes each rank learns on its share of the groups
    adv = advantages.compute(c.scores, a.advantage, a.adv_eps)  # [K, G]
    first, last = distributed.share(len(adv))
    G = a.group_size
    batch = make_batch(c.rollouts[first * G : last * G], learner.policy.pad_id, mask_truncated=a.overlong.mode == "mask")
    batch.advantages = adv[first:last].flatten()

    # 5. policy update
    t0 = time.perf_counter()
    learn = learner.step(batch)
    t_learn = time.perf_counter() - t0

    # 6. new weights into the engine, then prove it serves them
    t_sync, t_canary, canary_diff = sync(run)

    # 7. the record: reward and accuracy of the first round, an unfiltered sample of the policy
    policy = summarise(c.first_round, rewards)
    task = run.task.metrics()  # the curriculum level these prompts came from
    run.task.update(policy["accuracy"])
    sampled_tokens = sum(sum(r.model_mask) for r in c.first_round)
    return StepMetrics(
        policy=policy, task=task, learn=learn, shaping=c.shaping,
        reward_std=float(torch.tensor([r.reward for r in c.first_round]).std()),
        entropy=-sum(sum(r.sampler_logprobs) for r in c.first_round) / max(sampled_tokens, 1),
        reward_errors=rewards.errors - errors_before,
        zero_adv_frac=float(advantages.flat_groups(c.first_scores).float().mean()),
        groups_trained=len(c.rollouts) // G, extra_rounds=c.rounds, dropped_prompts=c.dropped,
        discarded=(c.rounds + 1) * cfg.data.batch_size * G - len(c.rollouts),
        canary_diff=canary_diff,
        times=StepTimes(c.times["prompts"], c.times["rollout"], c.times["reward"], t_learn, t_sync, t_canary,
                        time.perf_counter() - t_step),
        tokens=c.times["tokens"],
        memory={k: distributed.global_max(v) for k, v in peak_memory(run.device).items()},  # the largest rank's
    ), c


def run_rl(cfg: TrainConfig, run_dir: Path, recipe_dir: Path | None = None) -> dict[str, float]:
    """The RL stage: `cfg.trainer.max_steps` RL steps into `run_dir`; return the last step's metrics
    (and the final eval). `recipe_dir`: the run dir of the recipe it is a stage of (rlvr.recipe).

    Across processes every rank runs this whole function (rlvr.distributed: rollouts split and shared,
    the learner sharded); rank 0 alone writes into `run_dir`."""
    t_start = time.perf_counter()
    return run_steps(build(cfg, run_dir), run_dir, rl_step, t_start, recipe_dir=recipe_dir)
