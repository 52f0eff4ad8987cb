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
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr import checkpoint, distributed, models
from rlvr.algorithms import advantages
from rlvr.algorithms.losses import kl_penalty, overlong_penalty
from rlvr.config import TrainConfig
from rlvr.data import Task
from rlvr.errors import RlvrError
from rlvr.evaluate import greedy
from rlvr.learner import Learner, make_batch
from rlvr.metrics import StepMetrics, StepTimes, peak_memory, sample_record, summarise
from rlvr.monitor import DegenerationMonitor
from rlvr.plot import plot
from rlvr.prompts import PromptFit
from rlvr.rewards import Rewards
from rlvr.rollout.multiturn import Generate
from rlvr.run import Run, build
from rlvr.rundir import GracefulStop
from rlvr.types import Rollout

log = logging.getLogger("rlvr")


class TrainingError(RlvrError, RuntimeError):
    """The run cannot go on (e.g. updates keep failing); the message says what is left on disk."""


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


def rl_step(run: Run, step: int) -> tuple[StepMetrics, Collected]:
    """One RL step: prompts -> groups -> scores -> advantages -> update -> sync (checked) -> its record."""
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
    t0 = time.perf_counter()
    run.engine.load_weights(run.canary.watch(learner.policy.named_weights(run.precision.engine_torch_dtype)))
    t_sync = time.perf_counter() - t0
    t0 = time.perf_counter()
    canary_diff = run.canary.check(run.engine, learner.scorer.sequence_logprobs)
    t_canary = time.perf_counter() - t0

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
        canary_diff=canary_diff,
        times=StepTimes(c.times["prompts"], c.times["rollout"], c.times["reward"], t_learn, t_sync, t_canary,
                        time.perf_counter() - t_step),
        tokens=c.times["tokens"],
        memory={k: distributed.global_max(v) for k, v in peak_memory(run.device).items()},  # the largest rank's
    ), c


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, float]:
    """Run `cfg.trainer.max_steps` RL steps; return the last step's metrics (and the final eval). With
    `sft.steps` > 0 the cold start runs first, into `run_dir/sft`, and RL starts from its model (rlvr.sft).

    Across processes every rank runs this whole function (rlvr.distributed: rollouts split and shared,
    the learner sharded); rank 0 alone writes into `run_dir`."""
    if cfg.sft.steps > 0:
        from rlvr.sft import cold_start

        cfg = cold_start(cfg, run_dir / "sft")
    t_start = time.perf_counter()
    run = build(cfg, run_dir)
    monitor = DegenerationMonitor([term for term in run.rewards.weights if term != cfg.reward.correct_term])

    def step(k: int, watch: Watch) -> dict[str, float]:
        metrics, collected = rl_step(run, k)
        record = metrics.flat()
        record.update(monitor.update(k, record))
        run.logger.log(k, record)
        watch.after(k, metrics, collected)
        return record

    return run_steps(run, run_dir, step, t_start)


def run_steps(run: Run, run_dir: Path, step: Callable[[int, Watch], dict[str, float]], t_start: float,
              what: str = "RL") -> dict[str, float]:
    """The loop around a stage's `step` (RL's, or the cold start's, rlvr.sft), which runs step k, logs
    its record, has the `Watch` check it, and returns the record: first the proof that the engine serves the learner's weights and the first
    evaluation (or a resumed run's state); then the steps from `run.start + 1` to `trainer.max_steps`,
    with evaluations and checkpoints as `trainer.*` says and a clean stop on SIGINT/SIGTERM; then the
    final evaluation, summary.json, curves.png and the model. Closes the run."""
    t, learner, logger = run.cfg.trainer, run.learner, run.logger
    watch = Watch(run, run_dir)
    stop = GracefulStop()
    try:
        run.canary.expect(learner.policy.named_weights(run.precision.engine_torch_dtype))
        run.canary.check(run.engine, learner.scorer.sequence_logprobs)
        if run.start == 0:
            first_eval = evaluate(run)
            logger.log(0, first_eval)
        else:
            log.info("resumed from %s at step %d", run.resume, run.start)
            first_eval = distributed.on_rank0(logger.first_record)
        record: dict[str, float] = {}
        if _stop_asked(stop):  # during the first evaluation: before any step starts
            log.warning("stopped by %s before step %d started; nothing more was trained. %s",
                        signal.Signals(stop.signal).name, run.start + 1,
                        f"Continue with the same command plus trainer.resume={run.resume} hydra.run.dir={run_dir}"
                        if run.resume else "")
            raise SystemExit(128 + stop.signal)
        for k in range(run.start + 1, t.max_steps + 1):
            record = step(k, watch)
            if t.eval_every and k % t.eval_every == 0 and k < t.max_steps:
                logger.log(k, evaluate(run))
            saved = None
            if t.save_every and (k % t.save_every == 0 or k == t.max_steps):
                saved = watch.save(k)
            if _stop_asked(stop):
                saved = saved or watch.save(k)
                log.warning("stopped after step %d by %s. Continue with the same command plus "
                            "trainer.resume=%s hydra.run.dir=%s", k, signal.Signals(stop.signal).name,
                            saved if saved else "auto", run_dir)
                raise SystemExit(128 + stop.signal)

        final_eval = evaluate(run)
        logger.log(t.max_steps, final_eval)
        logger.write_summary({"steps": t.max_steps, "wall_s": time.perf_counter() - t_start,
                              "first_eval": first_eval, "final_eval": final_eval, "last_step": record})
        log.info("%s: eval accuracy %.3f -> %.3f over %d steps", what, first_eval["eval/accuracy"],
                 final_eval["eval/accuracy"], t.max_steps)
        if distributed.rank() == 0:
            plot([run_dir], run_dir / "curves.png")
        if t.save_model:
            weights = learner.policy.export_weights()  # every rank takes part; rank 0 writes
            distributed.on_rank0(lambda: models.build_atomically(run_dir / "model",
                                                                 lambda path: learner.policy.save(path, weights), replace=True))
            log.info("final model: %s", run_dir / "model")
        return {**record, **final_eval}
    finally:
        stop.restore()
        run.close()


def _stop_asked(stop: GracefulStop) -> bool:
    """Whether a signal asked the run to stop, on any rank (all ranks stop alike: the answer is the
    collective's). A signal that lands while this runs is kept for the next call, never overwritten."""
    asked = int(distributed.global_max(float(stop.signal or 0)))
    if asked:
        stop.signal = stop.signal or asked
    return bool(asked)


def evaluate(run: Run) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts (eval/... metrics)."""
    return greedy(run.generate, run.eval_prompts, run.eval_ids, run.rewards)[0]


class Watch:
    """What the loop checks and keeps after each step: the warnings a user should see, the samples
    it writes, the run of skipped updates that ends a run, and the checkpoints."""

    def __init__(self, run: Run, run_dir: Path):
        self.run, self.run_dir = run, run_dir
        self.bad_steps = 0
        self.canary_warned = False

    def after(self, step: int, m: StepMetrics, c: Collected) -> None:
        cfg, tol = self.run.cfg, self.run.precision.canary_tol
        if m.zero_adv_frac == 1.0 and not cfg.algorithm.dynamic_sampling.enabled:
            log.warning("step %d: every group's rewards were all equal: no learning signal this step", step)
        # Half the tolerance is above every honest difference measured (docs: the canary's tolerance per
        # precision). Said once.
        if m.canary_diff > 0.5 * tol and not self.canary_warned:
            self.canary_warned = True
            log.warning("step %d: engine/learner canary difference %.2g is above half the canary tolerance %g, "
                        "more than any honest difference measured (rollout.canary_tol; said once, "
                        "sync/logprob_max_diff has every step's)", step, m.canary_diff, tol)
        t, G = cfg.trainer, cfg.algorithm.group_size
        if t.log_samples:
            r = c.first_round[0]
            log.info("sample (reward %.2f, answer %s): %r", r.reward, r.prompt.answer, r.text[:300])
        if t.samples_every and step % t.samples_every == 0:
            self.run.logger.samples(step, [sample_record(r, self.run.rewards, step=step)
                                           for r in c.rollouts[: t.log_samples * G]])
        self.skipped(step, m.learn["learn/skipped_updates"])

    def skipped(self, step: int, skipped: float) -> None:
        """A NaN/inf loss or gradient skips the update; too many in a row end the run."""
        t = self.run.cfg.trainer
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        if self.bad_steps >= t.max_bad_steps:
            done = checkpoint.complete_checkpoints(self.run_dir)
            raise TrainingError(
                f"step {step}: the update was skipped {self.bad_steps} steps in a row (non-finite loss or gradient; "
                f"trainer.max_bad_steps={t.max_bad_steps}). "
                + (f"The last good checkpoint is {done[-1]}." if done else "No checkpoint was written."))

    def save(self, step: int) -> Path | None:
        """A checkpoint of `step`; a failed write is reported and the run goes on (None)."""
        run = self.run
        return checkpoint.save_or_report(self.run_dir, step, run.learner, run.task, run.rewards,
                                         run.cfg.trainer.keep_last)
