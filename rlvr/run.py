"""Building a run: every part `rlvr train` and `rlvr eval` are made of, checked and built once by
`build`, in the order that fails fast. What bad input can break (the config, the rewards, the tools,
the task's data, the prompts against the context, the run dir) fails before a model loads where it
can be known then; the learner comes next, the rollout engine last (it takes the most memory).

    build(cfg, run_dir)                   -> Run with a learner, logger, canary: `rlvr train`
    build(cfg, run_dir, "sft", wrap_task=...) -> the same, drawing demonstrations: the cold start (rlvr.sft)
    build(cfg, run_dir, "dpo", ...)       -> the same for a preference stage (rlvr.preference)
    build(cfg, run_dir, training=False)   -> Run with an engine only: `rlvr eval`
"""

from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlvr import checkpoint, distributed, models, rundir
from rlvr.config import STAGES, Schedule, TrainConfig, check
from rlvr.data import StageSource, Task, build_task
from rlvr.host import keep_freed_memory
from rlvr.learner.precision import Precision, pick_device
from rlvr.learner.precision import resolve as resolve_precision
from rlvr.prompts import PromptFit
from rlvr.records import Prompt
from rlvr.rewards import MixedRewards, Rewards, build_rewards
from rlvr.rollout.engine import Canary, Engine, build_engine, canary_sequence, check_backend, check_engine
from rlvr.rollout.multiturn import Generate, build_tools, rollout_generator
from rlvr.runlog import Logger, NullLogger, manifest

log = logging.getLogger("rlvr")

CANARY_ANSWER = " <answer>42</answer>"
STAGE_TITLES = {"rl": "train", "sft": "cold start", "dpo": "preference stage"}  # the progress bar's


@dataclass
class Run:
    """The parts of a run, built by `build`; `close` releases them (engine, reward workers, logger)."""

    cfg: TrainConfig
    device: str
    precision: Precision
    model_path: Path  # the model the run starts from (and the KL reference)
    task: Task | StageSource  # what the stage draws from: the task, or a cold start's or a DPO stage's data
    rewards: Rewards | MixedRewards
    tokenizer: object
    fit: PromptFit  # prompts checked against the engine's context
    eval_prompts: list[Prompt]  # the held-out prompts, and their token ids
    eval_ids: list[list[int]]
    engine: Engine | None = None
    generate: Generate | None = None  # groups of completions for prompts: the engine's, or multi-turn with tools
    learner: object | None = None  # rlvr.learner.Learner (training only)
    canary: Canary | None = None
    logger: Logger | NullLogger = NullLogger()
    resume: Path | None = None  # the checkpoint a resumed run continues from
    start: int = 0  # the last step already done (a resumed run's checkpoint's)
    stage: str = "rl"  # "rl", "sft" (a cold start) or "dpo" (its checkpoints say so; another stage refuses them)
    schedule: Schedule | None = None  # the stage's steps, learning rate, evaluations and checkpoints (training only)

    def close(self) -> None:
        self.rewards.close()
        if self.engine is not None:
            self.engine.close()
        self.logger.close()


def build(cfg: TrainConfig, run_dir: Path, stage: str = "rl", training: bool = True, wrap_task=None) -> Run:
    """Check `cfg` and build the run's parts for the stage `stage` (rl, sft, dpo). `training`: also the
    learner, the run dir, the logger and the weight-sync canary, and a resumed run's state; else (`rlvr
    eval`) only what generates and scores. `wrap_task(task, tokenizer, tools)`: what the run draws its
    data from in place of the task (the cold start's demonstrations, rlvr.sft; a dataset's preference
    pairs, rlvr.preference). Across processes every rank builds its own (rank 0 alone writes into
    `run_dir`)."""
    check(cfg, training=training)
    schedule = cfg.schedule(stage)
    if training and (warning := schedule.short_warmup()):
        log.warning("%s: %s", STAGES[stage], warning)
    device = pick_device(cfg.launch.device)
    check_backend(cfg.rollout.backend, device)
    rewards = build_rewards(cfg, device)
    with _closed_on_error(rewards.close):
        tools = build_tools(cfg.tools, cfg.rollout)
        model_path = models.resolve(cfg.model, Path(cfg.cache_dir))
        log.info("model: %s", model_path)
        models.check(model_path)
        task = build_task(cfg, model_path)
        if wrap_task is not None:
            from transformers import AutoTokenizer

            task = wrap_task(task, AutoTokenizer.from_pretrained(model_path), tools)
        precision = resolve_precision(cfg.learner.precision, cfg.rollout.dtype, cfg.rollout.canary_tol, device)
        log.info("device %s (launch.device=%s), %s engine; precision: learner %s, engine %s, canary tolerance %g "
                 "(%s)", device, cfg.launch.device, cfg.rollout.backend, precision.learner, precision.engine_dtype,
                 precision.canary_tol, precision.why)
        check_engine(cfg.rollout, model_path, precision.engine_dtype, device)
        if cfg.launch.num_threads is not None:  # before the engine starts: vLLM pins its threads
            torch.set_num_threads(cfg.launch.num_threads)
        if not training:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            fit = PromptFit(tokenizer, cfg.rollout.max_model_len, cfg.rollout.max_tokens, tools)
            run = Run(cfg, device, precision, model_path, task, rewards, tokenizer, fit,
                      *fit.eval_prompts(task.eval_prompts()))
            return _with_engine(run, model_path, tools)

        if keep_freed_memory():  # each step's big tensors reuse the last step's pages instead of faulting in new ones
            log.info("malloc keeps freed memory for reuse (no page faults for each step's tensors; resident memory "
                     "stays at its peak)")
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        resume = checkpoint.find(cfg.trainer.resume, run_dir, stage)
        auto = cfg.trainer.resume == "auto"
        # A run dir that holds another run is refused before the learner loads (every rank stops alike);
        # it is written to only once everything that can fail on bad input has passed.
        distributed.on_rank0(rundir.refuse, run_dir, resume, cfg.trainer.overwrite, auto)
        learner = _learner(cfg, model_path, resume, device, precision, stage, schedule)
        log.info("learner: %s", learner.describe(cold_start=stage == "sft"))
        # Every prompt is checked against the engine's context before the engine starts.
        fit = PromptFit(learner.policy.tokenizer, cfg.rollout.max_model_len, cfg.rollout.max_tokens, tools)
        run = Run(cfg, device, precision, model_path, task, rewards, learner.policy.tokenizer, fit,
                  *fit.eval_prompts(task.eval_prompts()), learner=learner, resume=resume, stage=stage,
                  schedule=schedule)
        fit.probe(task, cfg.data.batch_size)
        distributed.on_rank0(rundir.prepare, run_dir, resume, cfg.trainer.overwrite, auto)  # the first write
        run.logger = Logger(run_dir, cfg, schedule.steps, STAGE_TITLES[stage]) \
            if distributed.rank() == 0 else NullLogger()
    with _closed_on_error(run.close):
        run.logger.write_manifest({
            **manifest(cfg, model_path, device), "resumed_from": str(resume) if resume else None,
            "shared_prefix": learner.scorer.shared_prefix, "compiled": learner.policy.compiled,
            "world_size": distributed.world_size(),
            "precision": {"learner": precision.learner, "engine_dtype": precision.engine_dtype,
                          "canary_tol": precision.canary_tol, "why": precision.why}})
        run.start = checkpoint.load_state(resume, learner, task, rewards) if resume else 0
        _with_engine(run, resume / "model" if resume else model_path, tools)  # a resumed run serves the checkpoint
        # Across processes each rank generates its share of every call and all ranks get all the rollouts.
        run.generate = distributed.split(run.generate)
        # A fixed sequence whose logprobs engine and learner must agree on after every sync.
        answer = run.tokenizer(CANARY_ANSWER, add_special_tokens=False).input_ids
        run.canary = Canary(canary_sequence(min(run.eval_ids, key=len), answer, run.engine.block_size(),
                                            cfg.rollout.max_model_len), precision.canary_tol,
                            # (measured on vLLM's CPU kernels only: scripts/export_faults.py)
                            drift=precision.engine_dtype == "bfloat16" and cfg.rollout.backend == "vllm"
                            and device == "cpu")
        return run


def _learner(cfg: TrainConfig, model_path: Path, resume: Path | None, device: str, precision: Precision,
             stage: str, schedule: Schedule):
    """The learner of `model_path`, or of a resumed run's checkpoint, on the stage's schedule. With LoRA
    it is the base model plus the adapter (the checkpoint's); the engine serves merged weights. RL
    scores at the sampling temperature and loads the frozen reference (`model_path`) for a KL term;
    the cold start and the preference stage score at temperature 1, the preference stage with DPO's
    reference (the stage's starting model), the cold start packing its rows as `sft.packing` says."""
    from rlvr.learner import Learner  # (torch and transformers' model code: only for training)

    lora = cfg.model.lora if cfg.model.lora.r > 0 else None
    policy_path = resume / "model" if resume else model_path
    return Learner(model_path if lora else policy_path, cfg.optim, cfg.algorithm, cfg.learner,
                   cfg.rollout.temperature if stage == "rl" else 1.0, cfg.rollout.max_tokens, device, precision,
                   reference_path=model_path, lora=lora,
                   adapter_path=checkpoint.adapter(resume, lora is not None) if resume else None,
                   with_reference=None if stage == "rl" else stage == "dpo" and cfg.dpo.loss == "dpo",
                   schedule=schedule, shared_prefix=cfg.sft.packing if stage == "sft" else None)


def _with_engine(run: Run, policy_path: Path, tools) -> Run:
    """Start the rollout engine on `policy_path` and give it to the run, its generator and the rewards."""
    cfg = run.cfg
    run.engine = build_engine(policy_path, cfg.rollout, run.precision.engine_dtype, cfg.seed, run.device,
                              Path(cfg.cache_dir))
    run.generate = rollout_generator(run.engine, run.tokenizer, tools, cfg.rollout)
    run.rewards.attach(run.engine, run.tokenizer)  # a judge term without a model of its own asks the policy
    return run


@contextlib.contextmanager
def _closed_on_error(close):
    """Call `close` if the block raises (a part that failed to build releases the ones built before it)."""
    try:
        yield
    except BaseException:
        close()
        raise
