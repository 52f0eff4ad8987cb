"""Typed schemas for every config group, registered in Hydra's ConfigStore, and the typed config a
run takes.

Hydra composes the YAML of `configs/`; `typed(cfg)` turns it into these dataclasses once, at the
entry point, and each component takes its own group (the learner a `LearnerConfig`, the engine a
`RolloutConfig`...). Defaults live in the YAML files alone (one home per default, each with its
comment); here every field is `MISSING`, so a key that a YAML file forgot fails when the config is
composed. The schemas give each key its type and each choice its `Choice`, so a misspelt key, a
wrong type or a choice that does not exist fails when Hydra composes the config (or earlier, on the
command line: rlvr.keys holds the command line and the composed config to these schemas' names),
naming the key, before any model loads. Then each schema checks its own values (its `check`), and
`TrainConfig.check` the combinations that span groups; every message names the key.

The groups, by concern: `trainer` (the loop: steps, evaluation, samples, checkpoints), `learner`
(how the policy computes: precision, compile, micro-batches, shared prefix), `launch` (where it runs:
device, threads, processes, nodes), `rollout` (generation and its tool turns), `algorithm`, `optim`,
`model`, `data`, `reward`, `tools`, `logger`, `eval`. The schemas of `data` and `reward` live in
rlvr.config_data, the words each choice takes in rlvr.choices, and `need` (one key's check) with its
`ConfigError` in rlvr.errors.

A task with knobs of its own (e.g. multiplication's operand digits) extends `DataConfig` and
registers under `data/<name>_schema`; its YAML lists that schema first in its defaults. A user's own
task may skip the schema: its keys are then checked by the task's constructor when it is built at
startup (`typed` keeps them in an `OpenDataConfig`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from rlvr.choices import (
    Advantage,
    Backend,
    Device,
    EngineDtype,
    KLEstimator,
    LossAgg,
    Overlong,
    Precision,
    PreferenceLoss,
    Ratio,
    WandbMode,
)
from rlvr.config_data import (
    BfclDataConfig,
    DataConfig,
    FileDataConfig,
    FunctionPickingDataConfig,
    MixtureDataConfig,
    MultiplicationDataConfig,
    OpenDataConfig,
    RewardConfig,
    reward_terms,
)
from rlvr.errors import ConfigError, need


@dataclass
class LoraConfig:
    r: int = MISSING
    alpha: float = MISSING
    dropout: float = MISSING
    target_modules: list[str] = MISSING

    def check(self) -> None:
        need(self.r >= 0, "model.lora.r", "must be >= 0 (0: no adapters, every weight trains)")
        need(0 <= self.dropout < 1, "model.lora.dropout", "must be in [0, 1)")
        need(self.r == 0 or len(self.target_modules) > 0, "model.lora.target_modules",
             "must name at least one layer when model.lora.r > 0")


@dataclass
class ModelConfig:
    path: str = MISSING
    build: str | None = MISSING
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class KLConfig:
    coef: float = MISSING
    reward_coef: float = MISSING
    estimator: KLEstimator = MISSING

    def check(self) -> None:
        need(self.coef >= 0 and self.reward_coef >= 0, "algorithm.kl", "coefficients must be >= 0")
        need(not (self.coef > 0 and self.estimator == "k1"), "algorithm.kl.estimator",
             "k1 in the loss (algorithm.kl.coef > 0) has zero expected gradient: it pulls nothing towards the "
             "reference. Use k3 (or k2) in the loss, or k1 in the reward (algorithm.kl.reward_coef)")
        need(not (self.coef > 0 and self.reward_coef > 0), "algorithm.kl",
             "KL in both the loss (kl.coef) and the reward (kl.reward_coef) penalises it twice; choose one")


@dataclass
class DynamicSamplingConfig:
    enabled: bool = MISSING
    max_rounds: int = MISSING


@dataclass
class OverlongConfig:
    mode: Overlong = MISSING
    buffer: int = MISSING


@dataclass
class AlgorithmConfig:
    name: str = MISSING
    group_size: int = MISSING
    advantage: Advantage = MISSING
    adv_eps: float = MISSING
    ratio: Ratio = MISSING
    clip_eps_low: float = MISSING
    clip_eps_high: float = MISSING
    dual_clip: float | None = MISSING
    loss_agg: LossAgg = MISSING
    kl: KLConfig = field(default_factory=KLConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    ppo_epochs: int = MISSING
    mini_batches: int = MISSING
    tis_cap: float | None = MISSING

    def check(self) -> None:
        need(self.group_size >= 2, "algorithm.group_size",
             f"must be >= 2 for group-relative advantages, got {self.group_size}")
        self.kl.check()
        need(0 <= self.clip_eps_low < 1, "algorithm.clip_eps_low", "must be in [0, 1)")
        need(self.clip_eps_high >= 0, "algorithm.clip_eps_high", "must be >= 0")
        need(self.dual_clip is None or self.dual_clip > 1, "algorithm.dual_clip", "must be > 1 (or null for none)")
        need(self.ratio == "token" or self.loss_agg == "seq_mean_token_mean", "algorithm.loss_agg",
             "a sequence-level ratio (GSPO) gives one loss per sequence; aggregate with seq_mean_token_mean, "
             f"not {self.loss_agg}")
        need(self.name != "dr_grpo" or (self.advantage == "dr_grpo" and self.loss_agg != "seq_mean_token_mean"),
             "algorithm.advantage",
             "Dr. GRPO removes the std normalisation and the per-sequence length normalisation: use "
             "advantage=dr_grpo and loss_agg=token_sum_norm (or pick another algorithm preset)")
        need(self.dynamic_sampling.max_rounds >= 0, "algorithm.dynamic_sampling.max_rounds", "must be >= 0")
        need(self.ppo_epochs >= 1, "algorithm.ppo_epochs", "must be >= 1")
        need(self.tis_cap is None or self.tis_cap >= 1, "algorithm.tis_cap", "must be >= 1 (or null for no correction)")


@dataclass
class RolloutConfig:
    temperature: float = MISSING
    top_p: float = MISSING
    max_tokens: int = MISSING
    kv_cache_gib: float = MISSING
    gpu_memory_utilization: float = MISSING
    max_model_len: int = MISSING
    canary_tol: float | None = MISSING
    dtype: EngineDtype = MISSING
    backend: Backend = MISSING
    max_turns: int = MISSING
    max_total_tokens: int | None = MISSING
    tool_timeout_s: float | None = MISSING
    tool_output_chars: int = MISSING

    def check(self, training: bool) -> None:
        need(self.temperature > 0, "rollout.temperature", "must be > 0 (the learner divides logits by it)")
        need(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        need(self.max_tokens >= 1, "rollout.max_tokens", "must be >= 1")
        need(self.max_model_len > self.max_tokens, "rollout.max_model_len",
             f"must be larger than rollout.max_tokens={self.max_tokens} (it holds the prompt and the completion)")
        need(self.canary_tol is None or self.canary_tol > 0, "rollout.canary_tol", "must be > 0 (or null: per precision)")
        if training:
            need(self.top_p == 1.0, "rollout.top_p",
                 f"must be 1.0 in training, got {self.top_p}: vLLM reports logprobs renormalised over the nucleus "
                 "while the learner scores the full softmax, so every ratio would be biased (rlvr eval may use "
                 "top_p < 1)")
        need(self.max_turns >= 1, "rollout.max_turns", "must be >= 1 (model turns per rollout when tools are configured)")
        need(self.max_total_tokens is None or self.max_total_tokens >= self.max_tokens, "rollout.max_total_tokens",
             f"must be >= rollout.max_tokens={self.max_tokens} (or null: up to rollout.max_model_len)")
        need(self.tool_output_chars >= 1, "rollout.tool_output_chars", "must be >= 1")


@dataclass
class OptimConfig:
    lr: float = MISSING
    weight_decay: float = MISSING
    betas: list[float] = MISSING
    max_grad_norm: float = MISSING
    warmup_steps: int = MISSING

    def check(self) -> None:
        need(self.lr > 0, "optim.lr", "must be > 0")
        need(len(self.betas) == 2, "optim.betas", "must hold two numbers")


@dataclass
class SftConfig:
    """The supervised cold start: `rlvr sft`, and the `sft` stage of a recipe."""

    steps: int = MISSING
    data: str = MISSING
    format: str = MISSING
    messages_key: str = MISSING
    prompt_key: str = MISSING
    completion_key: str = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    warmup_steps: int = MISSING
    packing: bool = MISSING
    eval_every: int = MISSING
    save_every: int = MISSING
    plateau_patience: int = MISSING
    plateau_gain: float = MISSING

    def check(self) -> None:
        need(self.steps >= 0, "sft.steps", f"must be >= 0 (0: no cold start), got {self.steps}")
        need(self.batch_size >= 1, "sft.batch_size", f"must be >= 1 (demonstrations per step), got {self.batch_size}")
        need_schedule(self, "sft")
        need(self.plateau_patience >= 0, "sft.plateau_patience",
             f"must be >= 0 (0: the cold start runs all sft.steps), got {self.plateau_patience}")
        need(self.plateau_gain >= 0, "sft.plateau_gain", f"must be >= 0, got {self.plateau_gain}")
        need(not self.plateau_patience or self.eval_every > 0, "sft.plateau_patience",
             "the plateau is watched at the evaluations: set sft.eval_every > 0 too")


@dataclass
class DpoConfig:
    """Preference tuning (DPO, SimPO): the `dpo` stage of a recipe."""

    steps: int = MISSING
    data: str = MISSING
    format: str = MISSING
    prompt_key: str = MISSING
    chosen_key: str = MISSING
    rejected_key: str = MISSING
    loss: PreferenceLoss = MISSING
    beta: float = MISSING
    simpo_gamma: float = MISSING
    batch_size: int = MISSING
    pairs_per_group: int = MISSING
    lr: float = MISSING
    warmup_steps: int = MISSING
    eval_every: int = MISSING
    save_every: int = MISSING

    def check(self) -> None:
        need(self.steps >= 0, "dpo.steps", f"must be >= 0, got {self.steps}")
        need(self.beta > 0, "dpo.beta", f"must be > 0, got {self.beta}")
        need(self.batch_size >= 1, "dpo.batch_size", f"must be >= 1 (pairs per step from a dataset), got {self.batch_size}")
        need(self.pairs_per_group >= 1, "dpo.pairs_per_group", f"must be >= 1, got {self.pairs_per_group}")
        need_schedule(self, "dpo")


@dataclass
class TrainerConfig:
    """The loop: how many steps, and what it evaluates, logs and keeps along the way."""

    max_steps: int = MISSING
    eval_every: int = MISSING
    save_model: bool = MISSING
    log_samples: int = MISSING
    samples_every: int = MISSING
    save_every: int = MISSING
    keep_last: int = MISSING
    resume: str | None = MISSING
    overwrite: bool = MISSING
    max_bad_steps: int = MISSING

    def check(self) -> None:
        need(self.max_steps >= 1, "trainer.max_steps",
             f"must be >= 1, got {self.max_steps} (to evaluate a model without training, use rlvr eval)")
        for key in ("save_every", "keep_last"):
            need(getattr(self, key) >= 0, f"trainer.{key}", f"must be >= 0, got {getattr(self, key)}")
        need(self.max_bad_steps >= 1, "trainer.max_bad_steps", "must be >= 1")


@dataclass
class LearnerConfig:
    """How the policy computes its update."""

    precision: Precision = MISSING
    compile: Any = MISSING  # auto | true | false
    micro_batch_size: int = MISSING
    shared_prefix: Any = MISSING  # auto | true | false

    def check(self) -> None:
        need(self.micro_batch_size >= 1, "learner.micro_batch_size", "must be >= 1")
        need(self.shared_prefix in ("auto", True, False), "learner.shared_prefix",
             f"must be auto, true or false, got {self.shared_prefix!r}")
        need(self.compile in ("auto", True, False), "learner.compile",
             f"must be auto, true or false, got {self.compile!r}")


@dataclass
class LaunchConfig:
    """Where the run runs: the device, the CPU threads, the processes and machines."""

    device: Device = MISSING
    num_threads: int | None = MISSING
    nproc_per_node: int = MISSING
    nnodes: int = MISSING
    node_rank: int = MISSING
    rdzv_endpoint: str | None = MISSING
    dist_timeout_s: float = MISSING

    def check(self) -> None:
        need(self.nproc_per_node >= 1 and self.nnodes >= 1, "launch.nproc_per_node",
             f"nproc_per_node and nnodes must be >= 1, got {self.nproc_per_node} and {self.nnodes}")
        need(0 <= self.node_rank < self.nnodes, "launch.node_rank",
             f"must be in [0, launch.nnodes={self.nnodes}), got {self.node_rank}")
        need(self.nnodes == 1 or bool(self.rdzv_endpoint), "launch.rdzv_endpoint",
             "must be set (host:port of node 0, reachable from every node) when launch.nnodes > 1")
        need(self.dist_timeout_s > 0, "launch.dist_timeout_s", "must be > 0")

    def processes(self) -> int:
        """The processes of the run: the launch's, or the launcher's (WORLD_SIZE) when one started this one."""
        return max(self.nproc_per_node * self.nnodes, int(os.environ.get("WORLD_SIZE", "1")))


@dataclass
class EvalConfig:
    n_samples: int = MISSING
    ks: list[int] = MISSING

    def check(self) -> None:
        need(self.n_samples >= 0, "eval.n_samples", "must be >= 0 (0: greedy only)")
        need(all(k >= 1 for k in self.ks), "eval.ks", "pass@k needs every k >= 1")


@dataclass
class LoggerConfig:
    wandb: bool = MISSING
    project: str = MISSING
    mode: WandbMode = MISSING
    name: str | None = MISSING


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    data: Any = MISSING  # typed by each data option's own schema; a user's task may have none (see above)
    reward: RewardConfig = MISSING
    algorithm: AlgorithmConfig = MISSING
    rollout: RolloutConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    learner: LearnerConfig = MISSING
    launch: LaunchConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = MISSING
    sft: SftConfig = MISSING
    dpo: DpoConfig = MISSING
    recipe: list[str] = MISSING
    # Tools the model may call (rlvr.tools): name -> {_target_, description, parameters, kwargs}; untyped
    # here like reward terms (so that `+tools.NAME...` works), checked by rlvr.tools.load_tools.
    tools: dict[str, Any] = field(default_factory=dict)
    seed: int = MISSING
    cache_dir: str = MISSING

    def check(self, training: bool = True) -> None:
        """Reject values and combinations that compose but cannot work, naming the key: each group checks
        its own keys, then what spans groups. `training`: also what only training cannot do (`rlvr eval`
        may sample with top-p, or serve a bf16 model)."""
        for group in (self.model.lora, self.data, self.reward, self.algorithm, self.optim, self.trainer,
                      self.learner, self.launch, self.eval, self.sft, self.dpo):
            group.check()
        self.rollout.check(training)
        a, r = self.algorithm, self.rollout
        need(a.overlong.mode != "soft" or 0 < a.overlong.buffer < r.max_tokens, "algorithm.overlong.buffer",
             f"must be in (0, rollout.max_tokens={r.max_tokens}) for the soft punishment")
        need(1 <= a.mini_batches <= self.data.batch_size * a.group_size, "algorithm.mini_batches",
             "must be between 1 and the sequences per step (data.batch_size * algorithm.group_size)")
        if self.launch.processes() > 1:
            need(self.model.lora.r == 0, "model.lora.r", "LoRA is not supported across processes yet: use one "
                 "process (launch.nproc_per_node=1) or model.lora.r=0")
            need(r.backend == "vllm", "rollout.backend", "only the vllm backend runs across processes")
        need(len(self.recipe) >= 1 and all(stage in STAGES for stage in self.recipe), "recipe",
             f"must list stages, each one of {', '.join(STAGES)}, got {list(self.recipe)}")
        need(len(set(self.recipe)) == len(self.recipe), "recipe", f"names a stage twice: {list(self.recipe)}")

    def schedule(self, stage: str) -> Schedule:
        """The schedule of the stage `stage` (rl, sft, dpo), from its own keys: RL's from `trainer` and
        `optim`, the cold start's from `sft.*`, the preference stage's from `dpo.*`."""
        if stage == "rl":
            t, o = self.trainer, self.optim
            return Schedule(t.max_steps, o.lr, o.warmup_steps, t.eval_every, t.save_every, "trainer.max_steps",
                            "optim.warmup_steps")
        s = getattr(self, stage)
        return Schedule(s.steps, s.lr, s.warmup_steps, s.eval_every, s.save_every, f"{stage}.steps",
                        f"{stage}.warmup_steps")

    def check_recipe(self) -> None:
        """For `rlvr train`: a stage the recipe lists needs steps, and steps asked of a stage it does not
        list are refused (`rlvr train sft.steps=100` once meant a cold start before RL: it names `recipe`)."""
        for name, n in (("sft", self.sft.steps), ("dpo", self.dpo.steps)):
            listed, show = name in self.recipe, lambda recipe: "[" + ",".join(recipe) + "]"
            need(not listed or n >= 1, f"{name}.steps",
                 f"recipe={show(self.recipe)} runs the {STAGES[name]}, which needs {name}.steps >= 1, got {n} "
                 f"(to leave it out: recipe={show([s for s in self.recipe if s != name])})")
            with_it = [name, *self.recipe] if name == "sft" else [*self.recipe[:-1], name, self.recipe[-1]]
            if not listed and n > 0:
                raise ConfigError(f"{name}.steps={n} asks for a {STAGES[name]}, but recipe={show(self.recipe)} does "
                                  f"not list it: add it (e.g. recipe={show(with_it)}) or set {name}.steps=0")


@dataclass(frozen=True)
class Schedule:
    """A stage's own schedule (`TrainConfig.schedule`): its optimizer steps, its learning rate and the
    steps of its linear warm-up, and how often it evaluates and checkpoints (0: only after the last
    step; never). `steps_key` and `warmup_key` name its keys in messages."""

    steps: int
    lr: float
    warmup_steps: int
    eval_every: int
    save_every: int
    steps_key: str
    warmup_key: str

    def short_warmup(self) -> str | None:
        """The warning a stage deserves when it never reaches its learning rate (its warm-up is longer
        than the stage), else None.

        >>> print(Schedule(5, 1e-4, 10, 0, 0, "sft.steps", "sft.warmup_steps").short_warmup())
        sft.warmup_steps=10 is longer than sft.steps=5: the learning rate never gets above 50% of its value (linear warm-up); set sft.warmup_steps to at most 5
        >>> Schedule(10, 1e-4, 10, 0, 0, "sft.steps", "sft.warmup_steps").short_warmup() is None
        True
        """
        steps, warmup, key = self.steps, self.warmup_steps, self.warmup_key
        if steps < 1 or warmup <= steps:
            return None
        return (f"{key}={warmup} is longer than {self.steps_key}={steps}: the learning rate never gets above "
                f"{steps / warmup:.0%} of its value (linear warm-up); set {key} to at most {steps}")


# Keys that moved when `trainer` was split by concern: the old name -> the new one.
RENAMED = {
    **{f"trainer.{k}": f"learner.{k}" for k in ("precision", "compile", "micro_batch_size", "shared_prefix")},
    **{f"trainer.{k}": f"launch.{k}" for k in ("device", "num_threads", "nproc_per_node", "nnodes", "node_rank",
                                               "rdzv_endpoint", "dist_timeout_s")},
}


def typed(cfg: DictConfig) -> TrainConfig:
    """The composed config as dataclasses, once, at the entry point (every interpolation resolved).
    A user's task without a schema becomes an `OpenDataConfig` holding its other keys."""
    try:
        out = OmegaConf.to_object(cfg)
    except Exception as e:  # a key whose value is missing (???) or an interpolation that does not resolve
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key or 'the config'}: {getattr(e, 'msg', e)}") from e
    out.reward.terms = reward_terms(out.reward.terms)
    if isinstance(out.data, dict):
        out.data = OpenDataConfig.parse(out.data)
    for name, source in getattr(out.data, "sources", {}).items():  # (a mixture's)
        try:
            source.reward.terms = reward_terms(source.reward.terms)
            if isinstance(source.data, dict):
                source.data = OpenDataConfig.parse(source.data)
        except ConfigError as e:  # (a source's keys named where they are)
            raise ConfigError(f"data.sources.{name}.{e}") from e
    return out


def register() -> None:
    """Put every schema in Hydra's ConfigStore (called once by the CLI before composing)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, node in [
        ("model", ModelConfig),
        ("data", DataConfig),
        ("reward", RewardConfig),
        ("algorithm", AlgorithmConfig),
        ("rollout", RolloutConfig),
        ("optim", OptimConfig),
        ("trainer", TrainerConfig),
        ("learner", LearnerConfig),
        ("launch", LaunchConfig),
        ("logger", LoggerConfig),
        ("eval", EvalConfig),
        ("sft", SftConfig),
        ("dpo", DpoConfig),
    ]:
        cs.store(group=group, name=f"{group}_schema", node=node)
    cs.store(group="data", name="multiplication_schema", node=MultiplicationDataConfig)
    cs.store(group="data", name="function_picking_schema", node=FunctionPickingDataConfig)
    cs.store(group="data", name="file_schema", node=FileDataConfig)
    cs.store(group="data", name="bfcl_schema", node=BfclDataConfig)
    cs.store(group="data", name="mixture_schema", node=MixtureDataConfig)


def check(cfg: TrainConfig, training: bool = True) -> None:
    """`cfg.check(training)`: every value and combination that composes but cannot work, refused naming
    the key (TrainConfig.check)."""
    cfg.check(training)


def need_schedule(stage: SftConfig | DpoConfig, node: str) -> None:
    """The checks a stage of its own steps shares (`node`: its config node): its learning rate and the
    steps of its warm-up, evaluations and checkpoints."""
    need(stage.lr > 0, f"{node}.lr", f"must be > 0, got {stage.lr}")
    for key in ("warmup_steps", "eval_every", "save_every"):
        value = getattr(stage, key)
        need(value >= 0, f"{node}.{key}", f"must be >= 0, got {value}")


STAGES = {"sft": "cold start", "dpo": "preference stage", "rl": "RL"}  # the stages a recipe may list (rlvr.recipe)
