"""The learner: the policy (`policy.py`), its forwards (`scoring.py`) and the update of every stage,
AdamW steps on an objective (`rlvr.algorithms.objective`: RL's, the cold start's, a preference loss)
over epochs, mini-batches and micro-batches; and the update's own state in a checkpoint (the LR
schedule, AdamW's moments)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings
from pathlib import Path

import torch

from rlvr import distributed
from rlvr.algorithms.losses import Normaliser, tis_weight
from rlvr.algorithms.objective import RL, Fixed, LossStats, Objective, PolicyLossConfig
from rlvr.config import AlgorithmConfig, LearnerConfig, LoraConfig, OptimConfig, Schedule
from rlvr.learner.policy import Policy
from rlvr.learner.precision import Precision
from rlvr.learner.scoring import Scorer
from rlvr.records import Batch

log = logging.getLogger(__name__)


def make_optimizer(model: torch.nn.Module, optim: OptimConfig, lr: float, warmup: int):
    """AdamW over what trains (every weight, or with LoRA the adapters alone: only they get optimizer
    state) at `lr`, with `optim`'s betas and weight decay, and its schedule: linear warmup over `warmup`
    steps of the stage, then constant. torch's fused AdamW: one pass over each tensor instead of one
    per operation."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  betas=tuple(optim.betas), weight_decay=optim.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0)
    return optimizer, scheduler


class Learner:
    """A transformers causal LM trained with AdamW on float32 master weights (computing in bf16 under
    `precision` bf16-mixed); a frozen copy serves as the KL reference when used. Its parts: `policy`
    (the model, wrapped, and its weights out), `scorer` (logprobs), and the update here."""

    def __init__(self, model_path: Path, optim: OptimConfig, algorithm: AlgorithmConfig, learner: LearnerConfig,
                 temperature: float, max_tokens: int, device: str, precision: Precision | None = None,
                 reference_path: Path | None = None, lora: LoraConfig | None = None,
                 adapter_path: Path | None = None, with_reference: bool | None = None,
                 schedule: Schedule | None = None, shared_prefix: str | bool | None = None):
        """`model_path`: the policy to train (a resumed run's checkpoint); `reference_path`: the initial
        model a KL term is measured against (default: `model_path`); `precision`: fp32 when None.
        With `lora` (`model.lora`, r > 0), `model_path` is the frozen base and adapters train on it,
        starting from those saved in `adapter_path` when given (a resumed run). `with_reference`: whether to
        load the frozen reference (None: when `algorithm` has a KL term; a DPO stage's objective needs it).
        `schedule`: the stage's learning rate and warm-up (None: `optim`'s); `shared_prefix`: the stage's
        setting of the shared-prefix forward (None: `learner.shared_prefix`; the cold start's packing)."""
        bf16 = precision is not None and precision.bf16
        self.policy = Policy(model_path, device, learner.compile, bf16, reference_path,
                             with_reference=algorithm.kl.coef > 0 or algorithm.kl.reward_coef > 0
                             if with_reference is None else with_reference,
                             lora=lora, adapter_path=adapter_path)
        self.shared_prefix_setting = learner.shared_prefix if shared_prefix is None else shared_prefix
        self.scorer = Scorer(self.policy, learner.micro_batch_size, self.shared_prefix_setting, algorithm.group_size,
                             temperature, bf16)
        self.algo, self.optim_cfg, self.max_tokens = algorithm, optim, max_tokens
        lr, warmup = (optim.lr, optim.warmup_steps) if schedule is None else (schedule.lr, schedule.warmup_steps)
        self.optimizer, self.scheduler = make_optimizer(self.policy.model, optim, lr, warmup)
        # The sampler/learner mismatch is larger in bf16: there the old policy defaults to the learner's
        # own logprobs, with TIS weights capped at 2, unless algorithm.tis_cap says otherwise.
        self.tis_cap = algorithm.tis_cap if algorithm.tis_cap is not None or not bf16 else 2.0
        self.rl = RL(PolicyLossConfig.of(algorithm), self.tis_cap, algorithm.ppo_epochs, algorithm.mini_batches)
        self.learner_cfg = learner

    def describe(self, cold_start: bool = False) -> str:
        """What the learner does and why, for the log: precision, the shared-prefix forward (in a cold
        start: packing, `sft.packing`), compilation and, in RL, the TIS cap chosen for bf16."""
        sc, po, learner = self.scorer, self.policy, self.learner_cfg
        forward, key = ("packing", "sft.packing") if cold_start else ("shared-prefix forward", "learner.shared_prefix")
        tis = "; TIS cap 2.0 for the bf16 mismatch" if self.tis_cap != self.algo.tis_cap and not cold_start else ""
        return (f"{po.device}, {'bf16-mixed' if sc.bf16 else 'fp32'} (float32 master weights); {forward} "
                f"{'on' if sc.shared_prefix else 'off'} ({key}={self.shared_prefix_setting}: {sc.shared_prefix_why}); "
                f"decoder layers {'compiled, the first step compiling them' if po.compiled else 'eager'} "
                f"(learner.compile={learner.compile}: {po.compile_why}){tis}")

    def state_dict(self) -> dict:
        """What a checkpoint's trainer.pt keeps of the learner: its LR schedule. (The weights:
        `policy.export_weights`; AdamW's state, sharded across processes: `save_optimizer`.)"""
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    def step(self, batch: Batch, objective: Objective | None = None) -> dict[str, float]:
        """Train on one batch with `objective` (default: RL's, `self.rl`): `objective.epochs` passes,
        each split into `objective.mini_batches` optimizer steps, each accumulating gradients over
        micro-batches of `learner.micro_batch_size` sequences. The one update path of every stage.

        What the objective holds fixed is taken first: the frozen reference's logprobs when it asks for
        them; with `tis_cap`, the learner's own logprobs before the update as the old policy, each token
        weighted by min(learner_old / sampler, tis_cap).
        """
        objective = objective or self.rl
        scorer = self.scorer
        scorer.tokens = 0
        anchor, tis = batch.old_logprobs, None
        scored = objective.rows(batch)  # the sequences the update runs
        # With TIS and one optimizer step per batch, every forward of the update runs at the old weights,
        # so it computes the old policy itself (`Fixed.old` None); otherwise a forward before the update does.
        in_forward = objective.tis_cap is not None and objective.epochs == 1 and objective.mini_batches == 1
        if objective.tis_cap is not None and not in_forward:
            anchor = batch.old_logprobs.clone()
            anchor[scored] = scorer.batch_logprobs(batch, rows=scored)[scored]
            tis = tis_weight(anchor, batch.old_logprobs, batch.loss_mask, objective.tis_cap)
        # The frozen reference's logprobs do not change over epochs: one forward for the whole batch.
        ref = scorer.batch_logprobs(batch, reference=True) if objective.reference else None
        fixed = Fixed(batch.old_logprobs, None if in_forward else anchor, tis, ref)
        updates: list[tuple[LossStats, dict[str, float]]] = []
        chunks = torch.arange(len(batch)).tensor_split(objective.mini_batches)
        for _ in range(objective.epochs):
            for rows in chunks:
                updates.append(self._update(batch.select(rows), fixed.take(rows), objective))
        lr = self.scheduler.get_last_lr()[0]  # the rate every update of this step used
        self.scheduler.step()  # the schedule (warmup) counts the stage's steps, not optimizer steps
        stats = [s for s, _ in updates]
        out = {
            "loss": sum(s.loss for s in stats) / len(stats),
            "grad_norm": sum(u["grad_norm"] for _, u in updates) / len(updates),
            "lr": lr,
            "learn/sequences": sum(u["sequences"] for _, u in updates),
            "learn/optimizer_steps": float(len(updates)),
            "learn/skipped_updates": sum(u["skipped"] for _, u in updates),
            "learn/tokens": distributed.global_sum([float(scorer.tokens)])[0],
            **objective.metrics(stats),
        }
        # Engine/learner mismatch with TIS: the sampled tokens' logprobs under the learner before any
        # update, over every sequence it scored first (else the objective's, from its first update).
        tokens = float(batch.loss_mask[scored].sum())
        if tis is not None and tokens:
            gap = ((anchor - batch.old_logprobs).abs() * batch.loss_mask)[scored]
            out["mismatch/logprob_abs_mean"], out["mismatch/logprob_abs_max"] = float(gap.sum()) / tokens, float(gap.max())
            out["mismatch/tokens"] = tokens
        return out

    def _update(self, batch: Batch, fixed: Fixed, objective: Objective) -> tuple[LossStats, dict[str, float]]:
        """One optimizer step on `batch` (a mini-batch) over the rows `objective.rows` picks, accumulated
        over micro-batches (a preference pair never split): the objective's sums over them, and the
        step's gradient norm, sequences run and whether it was skipped.

        Rows the objective leaves out still count in the normaliser (RL: advantage 0, whose gradient is
        exactly 0), so the update equals the one over the whole mini-batch.
        """
        # Across processes the batch is the union of every rank's part (rlvr.distributed).
        tokens, sequences = distributed.global_sum([float(batch.loss_mask.sum()), float(len(batch))])
        norm = Normaliser(tokens=int(tokens), sequences=int(sequences), max_tokens=self.max_tokens)
        rows = objective.rows(batch)
        self.optimizer.zero_grad(set_to_none=True)
        total = LossStats(0.0)
        scorer, model, device = self.scorer, self.policy.model, self.policy.device
        for sel in scorer.micro_batches(rows, objective.pair):
            if sel is None:  # nothing left here: a forward and backward at zero weight, to match theirs
                logp, _, _ = scorer.forward(model, scorer.idle)
                (logp.sum() * 0.0).backward()
                continue
            part = batch.select(sel)
            logp, mask, width = scorer.forward(model, part)  # [n, t]
            loss, stats = objective.loss(logp, mask, part, fixed.select(sel, width, device), norm)
            (loss * distributed.world_size()).backward()  # FSDP2 averages the ranks' gradients: undo it
            total.add(stats)
        out = {"grad_norm": self._clip_gradients(), "sequences": float(len(rows))}
        if distributed.world_size() > 1:  # the whole batch's figures
            names = [f.name for f in dataclasses.fields(total) if f.name != "mismatch_max"]
            for name, value in zip(names, distributed.global_sum([getattr(total, k) for k in names]), strict=True):
                setattr(total, name, value)
            total.mismatch_max = distributed.global_max(total.mismatch_max)
            out["sequences"] = distributed.global_sum([out["sequences"]])[0]
        out["skipped"] = float(not self._step_or_skip(total.loss, out["grad_norm"]))
        return total, out

    def _clip_gradients(self) -> float:
        """Clip the accumulated gradients to `optim.max_grad_norm`; their norm before clipping."""
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        return float(distributed.full(torch.nn.utils.clip_grad_norm_(trained, self.optim_cfg.max_grad_norm)))

    def _step_or_skip(self, loss: float, grad_norm: float) -> bool:
        """The optimizer step on the accumulated gradients, unless the loss or their norm is not finite:
        then they are dropped and the weights stay as they are. Whether it stepped."""
        stepped = math.isfinite(grad_norm) and math.isfinite(loss)
        if stepped:
            self.optimizer.step()
        else:
            log.warning("non-finite loss (%s) or gradient norm (%s): update skipped", loss, grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        return stepped

    def save_optimizer(self, path: Path) -> None:
        """AdamW's state into the folder `path` with torch.distributed.checkpoint: by parameter name, each
        rank writing its own shards (a collective; one process writes whole tensors). Any number of
        processes loads it back (`load_optimizer`): DCP reshards on load."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        distributed.reshard(self.policy.model)
        try:
            with single_process_quiet():
                dcp.save({"optimizer": get_optimizer_state_dict(self.policy.model, self.optimizer)}, checkpoint_id=path)
        except dcp.api.CheckpointException as e:  # a BaseException: give the callers what failed, as an OSError
            rank, (error, _) = next(iter(e.failures.items()))
            raise OSError(f"writing the optimizer state failed on rank {rank} (a full disk, or a file size limit?): "
                          f"{type(error).__name__}: {error}") from e

    def load_optimizer(self, path: Path) -> None:
        """Put back the AdamW state `save_optimizer` wrote, whatever world size wrote it (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        model = self.policy.model
        distributed.reshard(model)
        state = {"optimizer": get_optimizer_state_dict(model, self.optimizer)}  # the layout to fill
        try:
            with single_process_quiet():
                dcp.load(state, checkpoint_id=path)
        except dcp.api.CheckpointException as e:
            rank, (error, _) = next(iter(e.failures.items()))
            raise RuntimeError(f"rank {rank}: {type(error).__name__}: {error}") from e
        set_optimizer_state_dict(model, self.optimizer, state["optimizer"])


@contextlib.contextmanager
def single_process_quiet():
    """Without torch.distributed (one process), DCP warns at every save and load that it assumes one
    process, with its source line, on the console: that is what rlvr asks of it, so the warning is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield
