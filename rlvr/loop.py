"""The loop around a stage's step, shared by RL (rlvr.train) and the cold start (rlvr.sft): the first
checks and evaluation, the steps with their evaluations and checkpoints, a clean stop on a signal, the
final evaluation, summary, curves and model; and the `Watch` that checks each step's record."""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr import checkpoint, distributed, models
from rlvr.config import Schedule
from rlvr.errors import RlvrError
from rlvr.evaluate import greedy, sampled
from rlvr.metrics import StepMetrics, sample_record
from rlvr.monitor import DegenerationMonitor
from rlvr.plot import plot
from rlvr.run import Run
from rlvr.rundir import GracefulStop

log = logging.getLogger("rlvr")


class TrainingError(RlvrError, RuntimeError):
    """The run cannot go on (e.g. updates keep failing); the message says what is left on disk."""


def run_steps(run: Run, run_dir: Path, step: Callable[[Run, int, Watch], dict[str, float]], t_start: float,
              what: str = "RL", recipe_dir: Path | None = None, until: Plateau | None = None) -> dict[str, float]:
    """The loop around a stage's `step` (rlvr.train.rl_step, rlvr.sft.sft_step, rlvr.preference.dpo_step),
    which runs step k of `run`, logs its record, has the `Watch` check it, and returns the record. First the proof that the engine serves
    the learner's weights and the first evaluation (or a resumed run's state); then the steps from `run.start + 1` to the stage's last (`run.schedule`),
    with evaluations and checkpoints as `trainer.*` says and a clean stop on SIGINT/SIGTERM; then the
    final evaluation, summary.json, curves.png and the model. Closes the run. `recipe_dir`: the run dir of
    the recipe this stage is the cold start of (a stopped stage says how to resume the whole recipe).
    `until`: the stage also ends at the evaluation where this plateau is reached (its last evaluation
    is then the final one).
    """
    s, learner, logger = run.schedule, run.learner, run.logger
    watch = Watch(run, run_dir, recipe_dir)
    stop = GracefulStop()
    try:
        run.canary.expect(learner.policy.named_weights(run.precision.engine_torch_dtype))
        run.canary.check(run.engine, learner.scorer.sequence_logprobs)
        if run.start == 0:
            first_eval = evaluate(run, until)
            logger.log(0, first_eval)
            if until is not None:
                until.reached(0, first_eval)  # (a model that passes already counts from here)
        else:
            log.info("resumed from %s at step %d", run.resume, run.start)
            first_eval = distributed.on_rank0(logger.first_record)
        record: dict[str, float] = {}
        if _stop_asked(stop):  # during the first evaluation: before any step starts
            log.warning("stopped by %s before step %d started; nothing more was trained. %s",
                        signal.Signals(stop.signal).name, run.start + 1,
                        f"Continue with the same command plus {watch.resume_with(run.resume)}"
                        if run.resume or recipe_dir else "")
            raise SystemExit(128 + stop.signal)
        last, final_eval = s.steps, None
        if run.start and until is not None:  # (resumed where it had ended: that evaluation, logged already)
            if (final_eval := until.replay(run_dir / "metrics.jsonl", run.start)) is not None:
                last = run.start
        for k in range(run.start + 1, last + 1):
            record = step(run, k, watch)
            evaluation = evaluate(run, until) if evaluation_follows(s, k) else None
            if evaluation is not None and k < s.steps:  # (the last step's is logged once its checkpoint is)
                logger.log(k, evaluation)
                if until is not None and distributed.global_max(float(until.reached(k, evaluation))):
                    last = k
            saved = None
            if s.save_every and (k % s.save_every == 0 or k == last):
                saved = watch.save(k)
            if _stop_asked(stop):
                saved = saved or watch.save(k)
                log.warning("stopped after step %d by %s. Continue with the same command plus %s", k,
                            signal.Signals(stop.signal).name, watch.resume_with(saved))
                raise SystemExit(128 + stop.signal)
            if k == last:
                final_eval = evaluation
                break
        if final_eval is None:  # (also a run resumed after its last step, before its evaluation)
            final_eval = evaluate(run, until)
        if last == s.steps:
            logger.log(last, final_eval)
        logger.write_summary({"steps": last, "wall_s": time.perf_counter() - t_start,
                              "first_eval": first_eval, "final_eval": final_eval, "last_step": record})
        log.info("%s: eval accuracy %.3f -> %.3f over %d steps", what, first_eval["eval/accuracy"],
                 final_eval["eval/accuracy"], last)
        if distributed.rank() == 0:
            plot([run_dir], run_dir / "curves.png")
        if run.cfg.trainer.save_model or run.stage != "rl":  # (what a cold start or preference stage is for)
            weights = learner.policy.export_weights()  # every rank takes part; rank 0 writes
            distributed.on_rank0(lambda: models.build_atomically(run_dir / "model",
                                                                 lambda path: learner.policy.save(path, weights), replace=True))
            log.info("final model: %s", run_dir / "model")
        return {**record, **final_eval}
    finally:
        stop.restore()
        run.close()


def evaluation_follows(schedule: Schedule, step: int) -> bool:
    """Whether the held-out evaluation runs after `step`: every `eval_every` steps of the stage and after the last."""
    return step == schedule.steps or bool(schedule.eval_every and step % schedule.eval_every == 0)


def sync(run: Run) -> tuple[float, float, float]:
    """The learner's new weights into the engine, then the proof that the engine serves them (the
    canary): (seconds of the sync, seconds of the check, the canary's logprob difference)."""
    learner, t0 = run.learner, time.perf_counter()
    run.engine.load_weights(run.canary.watch(learner.policy.named_weights(run.precision.engine_torch_dtype)))
    t1 = time.perf_counter()
    diff = run.canary.check(run.engine, learner.scorer.sequence_logprobs)
    return t1 - t0, time.perf_counter() - t1, diff


def _stop_asked(stop: GracefulStop) -> bool:
    """Whether a signal asked the run to stop, on any rank (all ranks stop alike: the answer is the
    collective's). A signal that lands while this runs is kept for the next call, never overwritten."""
    asked = int(distributed.global_max(float(stop.signal or 0)))
    if asked:
        stop.signal = stop.signal or asked
    return bool(asked)


def evaluate(run: Run, until: Plateau | None = None) -> dict[str, float]:
    """Greedy accuracy on the held-out prompts (eval/... metrics); with `until`, also the sampled
    pass@n its plateau watches."""
    out = greedy(run.generate, run.eval_prompts, run.eval_ids, run.rewards)[0]
    if until is not None:
        out.update(sampled(run.generate, run.eval_prompts, run.eval_ids, run.rewards, until.n, [until.n],
                           run.cfg.seed)[0])
    return out


class Plateau:
    """Where a stage ends before its last step: when the held-out pass@n (`n` answers sampled a prompt,
    at least one right) has risen by less than `gain` over its best for `patience` evaluations in a
    row. The count starts once pass@n first rises by `gain` (from 0, before anything is learned).
    The cold start's use (`sft.plateau_patience`): at the RL group size, the share of prompts RL can
    learn from or has learned stops growing.

    >>> p = Plateau(n=8, patience=2, gain=0.02)
    >>> [p.reached(k, {"eval/pass@8": v}) for k, v in enumerate([0.0, 0.0, 0.30, 0.50, 0.51, 0.515, 0.60])]
    [False, False, False, False, False, True, False]
    """

    def __init__(self, n: int, patience: int, gain: float):
        self.n, self.patience, self.gain = n, patience, gain
        self.key = f"eval/pass@{n}"
        self.best, self.flat = 0.0, 0  # the best pass@n so far; evaluations in a row without a rise since

    def reached(self, step: int, evaluation: dict[str, float]) -> bool:
        """Count the evaluation after `step`; whether the plateau is reached (said in the log)."""
        value = evaluation[self.key]
        if value >= self.best + self.gain:
            self.best, self.flat = value, 0
        elif self.best > 0:
            self.flat += 1
        if self.flat < self.patience:
            return False
        log.info("%s %.3f after step %d: below %.3f + %g for %d evaluations in a row; the stage ends here",
                 self.key, value, step, self.best, self.gain, self.flat)
        return True

    def replay(self, metrics: Path, start: int) -> dict[str, float] | None:
        """Count again the evaluations a resumed run logged up to its checkpoint at step `start` (its
        metrics.jsonl); the evaluation of `start` if the plateau was reached there, else None."""
        if not metrics.is_file():  # (another process's disk: it counts from here)
            return None
        with open(metrics) as f:
            records = [r for r in map(json.loads, f) if self.key in r and r["step"] <= start]
        for record in records:
            if self.reached(record["step"], record):
                return {k: v for k, v in record.items() if k != "step"} if record["step"] == start else None
        return None


class Watch:
    """What the loop checks and keeps after each step: the warnings a user should see (and the signs of
    a degenerate policy, `monitor`), the samples it writes, the run of skipped updates that ends a run,
    and the checkpoints."""

    def __init__(self, run: Run, run_dir: Path, recipe_dir: Path | None = None):
        self.run, self.run_dir, self.recipe_dir = run, run_dir, recipe_dir
        self.bad_steps = 0
        self.canary_warned = False
        self.monitor = DegenerationMonitor([t for t in run.rewards.weights if t not in run.rewards.correct_terms])
        # what each checkpoint says of the run that wrote it (rlvr.rundir.refuse_other_stage reads it)
        self.written_by = {"stage": run.stage, "run_dir": str(recipe_dir or run_dir),
                           "command": "sft" if run.stage == "sft" and recipe_dir is None else "train"}

    def resume_with(self, checkpoint: Path | None) -> str:
        """The overrides that continue this run from `checkpoint` (None: the newest): in the cold start of
        a recipe, the whole recipe's (its stage finds its own checkpoint)."""
        if self.recipe_dir is not None:
            return f"trainer.resume=auto hydra.run.dir={self.recipe_dir}"
        return f"trainer.resume={checkpoint or 'auto'} hydra.run.dir={self.run_dir}"

    def after(self, step: int, m: StepMetrics, c: Any) -> None:
        """After an RL step (`c`: its rlvr.train.Collected): the warnings, the samples, the skipped updates."""
        cfg = self.run.cfg
        if m.zero_adv_frac == 1.0 and not cfg.algorithm.dynamic_sampling.enabled:
            log.warning("step %d: every group's rewards were all equal: no learning signal this step", step)
        self.canary(step, m.canary_diff)
        t, G = cfg.trainer, cfg.algorithm.group_size
        if t.log_samples:
            r = c.first_round[0]
            log.info("sample (reward %.2f, answer %s): %r", r.reward, r.prompt.answer, r.text[:300])
        if t.samples_every and (step % t.samples_every == 0 or step == self.run.schedule.steps):  # (a short run's too)
            self.run.logger.samples(step, [sample_record(r, self.run.rewards, step=step)
                                           for r in c.rollouts[: t.log_samples * G]])
        self.skipped(step, m.learn["learn/skipped_updates"])

    def canary(self, step: int, diff: float) -> None:
        """Half the tolerance is above every honest difference measured (docs: the canary's tolerance per
        precision): a warning, said once."""
        tol = self.run.precision.canary_tol
        if diff > 0.5 * tol and not self.canary_warned:
            self.canary_warned = True
            log.warning("step %d: engine/learner canary difference %.2g is above half the canary tolerance %g, "
                        "more than any honest difference measured (rollout.canary_tol; said once, "
                        "sync/logprob_max_diff has every step's)", step, diff, tol)

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
                                         run.cfg.trainer.keep_last, self.written_by)
