"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Defaults live in the YAML files of `configs/` (one home per default); these
dataclasses give each key its type, so a misspelt key or a wrong type fails when
Hydra composes the config, before any model loads. `check(cfg)` then rejects
combinations that make no sense.

A task with knobs of its own (e.g. multiplication's operand digits) extends
`DataConfig` and registers under `data/<name>_schema`; its YAML lists that schema
first in its defaults. A user's own task may skip the schema: its keys are then
checked by the task's constructor when it is built at startup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from rlvr.errors import RlvrError
from rlvr.precision import ENGINE_DTYPES, PRECISIONS


@dataclass
class LoraConfig:
    r: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])


@dataclass
class ModelConfig:
    path: str = MISSING
    build: str | None = None
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    _target_: str = MISSING
    batch_size: int = 8
    eval_size: int = 64
    system_prompt: str | None = None


@dataclass
class MultiplicationDataConfig(DataConfig):
    _target_: str = "rlvr.data.multiplication.MultiplicationTask"
    levels: list[list[int]] = field(default_factory=lambda: [[4, 2]])
    advance_at: float | None = None
    window: int = 4
    eval_fraction: float = 0.1
    template: str = MISSING


@dataclass
class FunctionPickingDataConfig(DataConfig):
    _target_: str = "rlvr.data.function_picking.FunctionPickingTask"
    distractors: int = 3
    arguments: str = "none"
    eval_fraction: float = 0.15
    template: str = MISSING


@dataclass
class FileDataConfig(DataConfig):
    _target_: str = "rlvr.data.files.DatasetTask"
    path: str = MISSING
    format: str = "auto"
    split: str | None = None
    prompt_key: str | None = "prompt"
    answer_key: str = "answer"
    messages_key: str | None = None
    system_key: str | None = None
    prompt_template: str = "{prompt}"
    eval_path: str | None = None
    eval_split: str | None = None
    shuffle: bool = True
    max_prompt_tokens: int | None = None


@dataclass
class RewardTerm:
    _target_: str = MISSING
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig:
    # Each term is a RewardTerm, left untyped here so that `+reward.terms.NAME._target_=...` can add one
    # from the command line (OmegaConf cannot create a dataclass node there); rlvr.keys and `check`
    # hold every term to RewardTerm's keys and types.
    terms: dict[str, Any] = field(default_factory=dict)
    correct_term: str = MISSING
    timeout_s: float | None = 10.0
    error_value: float = 0.0
    workers: int = 0
    combine: str = "sum_then_normalise"


@dataclass
class KLConfig:
    coef: float = 0.0
    reward_coef: float = 0.0
    estimator: str = "k3"


@dataclass
class DynamicSamplingConfig:
    enabled: bool = False
    max_rounds: int = 3


@dataclass
class OverlongConfig:
    mode: str = "none"
    buffer: int = 16


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    group_size: int = 8
    advantage: str = "grpo"
    adv_eps: float = 1e-6
    ratio: str = "token"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    loss_agg: str = "token_mean"
    kl: KLConfig = field(default_factory=KLConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    ppo_epochs: int = 1
    mini_batches: int = 1
    tis_cap: float | None = None


@dataclass
class RolloutConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.3
    max_model_len: int = 1024
    canary_tol: float | None = None
    dtype: str = "auto"
    backend: str = "vllm"
    max_turns: int = 4
    max_total_tokens: int | None = None
    tool_timeout_s: float | None = 5.0
    tool_output_chars: int = 1000


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    warmup_steps: int = 0


@dataclass
class TrainerConfig:
    max_steps: int = 10
    micro_batch_size: int = 64
    device: str = "auto"
    num_threads: int | None = None
    eval_every: int = 0
    save_model: bool = True
    log_samples: int = 2
    samples_every: int = 5
    save_every: int = 0
    keep_last: int = 2
    resume: str | None = None
    overwrite: bool = False
    max_bad_steps: int = 3
    shared_prefix: Any = "auto"
    precision: str = "fp32"
    compile: Any = "auto"
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    dist_timeout_s: float = 600.0


@dataclass
class EvalConfig:
    n_samples: int = 8
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])


@dataclass
class LoggerConfig:
    wandb: bool = False
    project: str = "rlvr"
    mode: str = "online"
    name: str | None = None


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    data: Any = MISSING  # typed by each data option's own schema; a user's task may have none (see above)
    reward: RewardConfig = MISSING
    algorithm: AlgorithmConfig = MISSING
    rollout: RolloutConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = MISSING
    # Tools the model may call (rlvr.tools): name -> {_target_, description, parameters, kwargs}; untyped
    # here like reward terms (so that `+tools.NAME...` works), checked by rlvr.tools.load_tools.
    tools: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    cache_dir: str = MISSING


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
        ("logger", LoggerConfig),
        ("eval", EvalConfig),
    ]:
        cs.store(group=group, name=f"{group}_schema", node=node)
    cs.store(group="data", name="multiplication_schema", node=MultiplicationDataConfig)
    cs.store(group="data", name="function_picking_schema", node=FunctionPickingDataConfig)
    cs.store(group="data", name="file_schema", node=FileDataConfig)


class ConfigError(RlvrError, ValueError):
    """A config that composes but makes no sense; the message names the key."""


ADVANTAGES = ("grpo", "dr_grpo", "rloo")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIOS = ("token", "sequence")
OVERLONG = ("none", "mask", "soft")
DEVICES = ("auto", "cpu", "cuda", "mps")
BACKENDS = ("vllm", "transformers")
COMBINE = ("sum_then_normalise", "normalise_then_sum")


def check(cfg: DictConfig, training: bool = True) -> None:
    """Reject values and combinations that compose but cannot work, naming the key. `training`: also
    what only training cannot do (`rlvr eval` may sample with top-p, or serve a bf16 model)."""

    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {why}")

    a, r, d = cfg.algorithm, cfg.rollout, cfg.data
    need("batch_size" in d, "data.batch_size", "must be set: the prompts per step")
    need(d.batch_size >= 1, "data.batch_size", f"must be >= 1 (the prompts per step), got {d.batch_size}")
    need(a.group_size >= 2, "algorithm.group_size", f"must be >= 2 for group-relative advantages, got {a.group_size}")
    need(a.advantage in ADVANTAGES, "algorithm.advantage", f"must be one of {ADVANTAGES}, got {a.advantage!r}")
    need(a.loss_agg in LOSS_AGGS, "algorithm.loss_agg", f"must be one of {LOSS_AGGS}, got {a.loss_agg!r}")
    need(a.kl.estimator in KL_ESTIMATORS, "algorithm.kl.estimator", f"must be one of {KL_ESTIMATORS}")
    need(a.kl.coef >= 0 and a.kl.reward_coef >= 0, "algorithm.kl", "coefficients must be >= 0")
    need(not (a.kl.coef > 0 and a.kl.estimator == "k1"), "algorithm.kl.estimator",
         "k1 in the loss (algorithm.kl.coef > 0) has zero expected gradient: it pulls nothing towards the "
         "reference. Use k3 (or k2) in the loss, or k1 in the reward (algorithm.kl.reward_coef)")
    need(not (a.kl.coef > 0 and a.kl.reward_coef > 0), "algorithm.kl",
         "KL in both the loss (kl.coef) and the reward (kl.reward_coef) penalises it twice; choose one")
    need(0 <= a.clip_eps_low < 1, "algorithm.clip_eps_low", "must be in [0, 1)")
    need(a.clip_eps_high >= 0, "algorithm.clip_eps_high", "must be >= 0")
    need(a.dual_clip is None or a.dual_clip > 1, "algorithm.dual_clip", "must be > 1 (or null for none)")
    need(a.ratio in RATIOS, "algorithm.ratio", f"must be one of {RATIOS}, got {a.ratio!r}")
    need(a.ratio == "token" or a.loss_agg == "seq_mean_token_mean", "algorithm.loss_agg",
         "a sequence-level ratio (GSPO) gives one loss per sequence; aggregate with seq_mean_token_mean, "
         f"not {a.loss_agg}")
    need(a.name != "dr_grpo" or (a.advantage == "dr_grpo" and a.loss_agg != "seq_mean_token_mean"),
         "algorithm.advantage",
         "Dr. GRPO removes the std normalisation and the per-sequence length normalisation: use "
         "advantage=dr_grpo and loss_agg=token_sum_norm (or pick another algorithm preset)")
    need(a.overlong.mode in OVERLONG, "algorithm.overlong.mode", f"must be one of {OVERLONG}")
    need(a.overlong.mode != "soft" or 0 < a.overlong.buffer < r.max_tokens, "algorithm.overlong.buffer",
         f"must be in (0, rollout.max_tokens={r.max_tokens}) for the soft punishment")
    need(a.dynamic_sampling.max_rounds >= 0, "algorithm.dynamic_sampling.max_rounds", "must be >= 0")
    need(a.ppo_epochs >= 1, "algorithm.ppo_epochs", "must be >= 1")
    need(1 <= a.mini_batches <= d.batch_size * a.group_size, "algorithm.mini_batches",
         "must be between 1 and the sequences per step (data.batch_size * algorithm.group_size)")
    need(a.tis_cap is None or a.tis_cap >= 1, "algorithm.tis_cap", "must be >= 1 (or null for no correction)")
    need(d.get("eval_size", 1) >= 1, "data.eval_size", "must be >= 1 (the evaluation and the weight-sync canary use these prompts)")
    need(r.temperature > 0, "rollout.temperature", "must be > 0 (the learner divides logits by it)")
    need(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    need(r.max_tokens >= 1, "rollout.max_tokens", "must be >= 1")
    need(r.max_model_len > r.max_tokens, "rollout.max_model_len",
         f"must be larger than rollout.max_tokens={r.max_tokens} (it holds the prompt and the completion)")
    need(cfg.trainer.max_steps >= 1, "trainer.max_steps",
         f"must be >= 1, got {cfg.trainer.max_steps} (to evaluate a model without training, use rlvr eval)")
    need(cfg.trainer.save_every >= 0 and cfg.trainer.keep_last >= 0, "trainer.save_every",
         "save_every and keep_last must be >= 0")
    need(cfg.trainer.max_bad_steps >= 1, "trainer.max_bad_steps", "must be >= 1")
    need(cfg.trainer.micro_batch_size >= 1, "trainer.micro_batch_size", "must be >= 1")
    need(cfg.trainer.shared_prefix in ("auto", True, False), "trainer.shared_prefix",
         f"must be auto, true or false, got {cfg.trainer.shared_prefix!r}")
    need(not cfg.trainer.precision.startswith(("fp16", "16", "float16")), "trainer.precision",
         f"{cfg.trainer.precision!r} is refused: CPUs have no fast fp16 matmul and fp16 training needs loss scaling, "
         "which rlvr does not do; use bf16-mixed (or auto)")
    need(cfg.trainer.precision in PRECISIONS, "trainer.precision", f"must be one of {PRECISIONS}")
    need(cfg.trainer.compile in ("auto", True, False), "trainer.compile",
         f"must be auto, true or false, got {cfg.trainer.compile!r}")
    need(r.dtype in ENGINE_DTYPES, "rollout.dtype", f"must be one of {ENGINE_DTYPES}, got {r.dtype!r}")
    need(r.canary_tol is None or r.canary_tol > 0, "rollout.canary_tol", "must be > 0 (or null: per precision)")
    if training:
        need(r.top_p == 1.0, "rollout.top_p",
             f"must be 1.0 in training, got {r.top_p}: vLLM reports logprobs renormalised over the nucleus while "
             "the learner scores the full softmax, so every ratio would be biased (rlvr eval may use top_p < 1)")
    need(cfg.trainer.device in DEVICES, "trainer.device", f"must be one of {DEVICES}")
    need(r.backend in BACKENDS, "rollout.backend", f"must be one of {BACKENDS}, got {r.backend!r}")
    need(r.max_turns >= 1, "rollout.max_turns", "must be >= 1 (model turns per rollout when tools are configured)")
    need(r.max_total_tokens is None or r.max_total_tokens >= r.max_tokens, "rollout.max_total_tokens",
         f"must be >= rollout.max_tokens={r.max_tokens} (or null: up to rollout.max_model_len)")
    need(r.tool_output_chars >= 1, "rollout.tool_output_chars", "must be >= 1")
    need(cfg.optim.lr > 0, "optim.lr", "must be > 0")
    need(cfg.model.lora.r >= 0, "model.lora.r", "must be >= 0 (0: no adapters, every weight trains)")
    need(0 <= cfg.model.lora.dropout < 1, "model.lora.dropout", "must be in [0, 1)")
    need(cfg.model.lora.r == 0 or len(cfg.model.lora.target_modules) > 0, "model.lora.target_modules",
         "must name at least one layer when model.lora.r > 0")
    need(len(cfg.optim.betas) == 2, "optim.betas", "must hold two numbers")
    t = cfg.trainer
    need(t.nproc_per_node >= 1 and t.nnodes >= 1, "trainer.nproc_per_node",
         f"nproc_per_node and nnodes must be >= 1, got {t.nproc_per_node} and {t.nnodes}")
    need(0 <= t.node_rank < t.nnodes, "trainer.node_rank", f"must be in [0, trainer.nnodes={t.nnodes}), got {t.node_rank}")
    need(t.nnodes == 1 or t.rdzv_endpoint, "trainer.rdzv_endpoint",
         "must be set (host:port of node 0, reachable from every node) when trainer.nnodes > 1")
    need(t.dist_timeout_s > 0, "trainer.dist_timeout_s", "must be > 0")
    if t.nproc_per_node * t.nnodes > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        need(cfg.model.lora.r == 0, "model.lora.r", "LoRA is not supported across processes yet: use one process "
             "(trainer.nproc_per_node=1) or model.lora.r=0")
        need(r.backend == "vllm", "rollout.backend", "only the vllm backend runs across processes")
    for name, term in cfg.reward.terms.items():
        key = f"reward.terms.{name}"
        need(isinstance(term, DictConfig) and isinstance(term.get("_target_"), str), f"{key}._target_",
             "is missing: each term names its reward function by dotted path")
        need(isinstance(term.get("weight", 1.0), int | float) and not isinstance(term.get("weight"), bool),
             f"{key}.weight", f"must be a number, got {term.get('weight')!r}")
        need(isinstance(term.get("kwargs", {}), dict | DictConfig), f"{key}.kwargs",
             "must be a mapping of the function's keyword arguments")
    need(cfg.reward.correct_term in cfg.reward.terms, "reward.correct_term",
         f"names the term that defines accuracy; {cfg.reward.correct_term!r} is not one of {list(cfg.reward.terms)}")
    need(cfg.reward.timeout_s is None or cfg.reward.timeout_s >= 0, "reward.timeout_s", "must be >= 0 (0 or null: none)")
    need(cfg.reward.workers >= 0, "reward.workers", "must be >= 0 (0: score in this process)")
    need(cfg.reward.combine in COMBINE, "reward.combine", f"must be one of {COMBINE}, got {cfg.reward.combine!r}")
    need(cfg.eval.n_samples >= 0, "eval.n_samples", "must be >= 0 (0: greedy only)")
    need(all(k >= 1 for k in cfg.eval.ks), "eval.ks", "pass@k needs every k >= 1")
    need(cfg.logger.mode in ("online", "offline", "disabled"), "logger.mode", "must be online, offline or disabled")
