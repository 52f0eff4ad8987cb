"""The learner: the policy (`policy.py`), its forwards (`scoring.py`) and the RL update, an AdamW step
on the policy objective (`rlvr.algorithms.objective`) over epochs, mini-batches and micro-batches;
and the update's own state in a checkpoint (the LR schedule, AdamW's moments)."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from pathlib import Path

import torch

from rlvr import distributed
from rlvr.algorithms.losses import Normaliser, tis_weight
from rlvr.algorithms.objective import PolicyLossConfig, policy_loss, sft_loss
from rlvr.config import AlgorithmConfig, LearnerConfig, LoraConfig, OptimConfig
from rlvr.learner.policy import Policy
from rlvr.learner.scoring import Scorer
from rlvr.precision import Precision
from rlvr.types import Batch

log = logging.getLogger(__name__)


def make_optimizer(model: torch.nn.Module, optim: OptimConfig):
    """AdamW over what trains (every weight, or with LoRA the adapters alone: only they get optimizer
    state), and its schedule: linear warmup over `optim.warmup_steps` RL steps, then constant.
    torch's fused AdamW: one pass over each tensor instead of one per operation (on SmolLM2 on the
    CPU, 0.1 s a step instead of 0.5-0.9 s)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=optim.lr,
                                  betas=tuple(optim.betas), weight_decay=optim.weight_decay, fused=True)
    warmup = optim.warmup_steps
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
                 adapter_path: Path | None = None):
        """`model_path`: the policy to train (a resumed run's checkpoint); `reference_path`: the initial
        model a KL term is measured against (default: `model_path`); `precision`: fp32 when None.
        With `lora` (`model.lora`, r > 0), `model_path` is the frozen base and adapters train on it,
        starting from those saved in `adapter_path` when given (a resumed run)."""
        bf16 = precision is not None and precision.bf16
        self.policy = Policy(model_path, device, learner.compile, bf16, reference_path,
                             with_reference=algorithm.kl.coef > 0 or algorithm.kl.reward_coef > 0, lora=lora,
                             adapter_path=adapter_path)
        self.scorer = Scorer(self.policy, learner.micro_batch_size, learner.shared_prefix, algorithm.group_size,
                             temperature, bf16)
        self.algo, self.optim_cfg, self.max_tokens = algorithm, optim, max_tokens
        self.optimizer, self.scheduler = make_optimizer(self.policy.model, optim)
        # The sampler/learner mismatch is larger in bf16: there the old policy defaults to the learner's
        # own logprobs, with TIS weights capped at 2, unless algorithm.tis_cap says otherwise.
        self.tis_cap = algorithm.tis_cap if algorithm.tis_cap is not None or not bf16 else 2.0
        self.objective = PolicyLossConfig.of(algorithm)
        self.learner_cfg = learner

    def describe(self, cold_start: bool = False) -> str:
        """What the learner does and why, for the log: precision, the shared-prefix forward (in a cold
        start: packing, `sft.packing`), compilation and, in RL, the TIS cap chosen for bf16."""
        sc, po, learner = self.scorer, self.policy, self.learner_cfg
        forward, key = ("packing", "sft.packing") if cold_start else ("shared-prefix forward", "learner.shared_prefix")
        tis = "; TIS cap 2.0 for the bf16 mismatch" if self.tis_cap != self.algo.tis_cap and not cold_start else ""
        return (f"{po.device}, {'bf16-mixed' if sc.bf16 else 'fp32'} (float32 master weights); {forward} "
                f"{'on' if sc.shared_prefix else 'off'} ({key}={learner.shared_prefix}: {sc.shared_prefix_why}); "
                f"decoder layers {'compiled, the first step compiling them' if po.compiled else 'eager'} "
                f"(learner.compile={learner.compile}: {po.compile_why}){tis}")

    def state_dict(self) -> dict:
        """What a checkpoint's trainer.pt keeps of the learner: its LR schedule. (The weights:
        `policy.export_weights`; AdamW's state, sharded across processes: `save_optimizer`.)"""
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    def step(self, batch: Batch) -> dict[str, float]:
        """Train on one batch: `ppo_epochs` passes, each split into `mini_batches` optimizer steps,
        each accumulating gradients over micro-batches of `learner.micro_batch_size` sequences.

        The old policy of the ratio is the sampler's logprobs; with `tis_cap` it is the learner's own
        logprobs before the update, and each token is weighted by min(learner_old / sampler, tis_cap).
        """
        a, scorer = self.algo, self.scorer
        scorer.tokens = 0
        anchor, tis = batch.old_logprobs, None
        # The sequences the update runs: without a KL term, those whose advantage is not zero.
        scored = torch.arange(len(batch)) if a.kl.coef > 0 else torch.nonzero(batch.advantages != 0).flatten()
        # With TIS the old policy is the learner's own logprobs. With one optimizer step per batch, every
        # forward of the update runs at the old weights, so it computes them itself (`_update`, old=None);
        # otherwise a forward before the update does.
        in_forward = self.tis_cap is not None and a.ppo_epochs == 1 and a.mini_batches == 1
        if self.tis_cap is not None and not in_forward:
            anchor = batch.old_logprobs.clone()
            anchor[scored] = scorer.batch_logprobs(batch, rows=scored)[scored]
            tis = tis_weight(anchor, batch.old_logprobs, batch.loss_mask, self.tis_cap)
        # The frozen reference's logprobs do not change over epochs: one forward for the whole batch.
        ref = scorer.batch_logprobs(batch, reference=True) if a.kl.coef > 0 else None
        stats: list[dict[str, float]] = []
        chunks = torch.arange(len(batch)).tensor_split(a.mini_batches)
        for _ in range(a.ppo_epochs):
            for rows in chunks:
                stats.append(self._update(batch.select(rows), None if in_forward else anchor[rows],
                                          None if tis is None else tis[rows], None if ref is None else ref[rows]))
        lr = self.scheduler.get_last_lr()[0]  # the rate every update of this step used
        self.scheduler.step()  # the schedule (warmup) counts RL steps, not optimizer steps
        # Engine/learner mismatch: logprobs of the sampled tokens under the learner before any update,
        # over the sequences the learner ran: all it scored first with TIS, else those of the first
        # mini-batch it ran (non-zero advantage, or all with a KL term).
        gap = ((anchor - batch.old_logprobs).abs() * batch.loss_mask)[scored] if tis is not None else None
        first = stats[0]
        tokens = float(batch.loss_mask[scored].sum())
        out = {
            "loss": sum(s["loss"] for s in stats) / len(stats),
            "kl": None if a.kl.coef == 0 else sum(s["kl"] for s in stats) / len(stats),
            "clip_frac": sum(s["clipped"] for s in stats) / max(sum(s["tokens"] for s in stats), 1.0),
            "grad_norm": sum(s["grad_norm"] for s in stats) / len(stats),
            "lr": lr,
            "learn/sequences": sum(s["sequences"] for s in stats),
            "learn/optimizer_steps": float(len(stats)),
            "learn/skipped_updates": sum(s["skipped"] for s in stats),
            "learn/tokens": distributed.global_sum([float(scorer.tokens)])[0],
        }
        if gap is not None and tokens:
            out["mismatch/logprob_abs_mean"], out["mismatch/logprob_abs_max"] = float(gap.sum()) / tokens, float(gap.max())
            out["mismatch/tokens"] = tokens
        elif first["tokens"]:  # measured on the first mini-batch, before this step's first update
            out["mismatch/logprob_abs_mean"] = first["mismatch_sum"] / first["tokens"]
            out["mismatch/logprob_abs_max"] = first["mismatch_max"]
            out["mismatch/tokens"] = first["tokens"]
        return out

    def _update(self, batch: Batch, anchor: torch.Tensor | None, tis: torch.Tensor | None,
                ref: torch.Tensor | None) -> dict[str, float]:
        """One optimizer step on `batch` (a mini-batch), accumulated over micro-batches. `anchor`: the
        old policy's logprobs [n, T-1]; None: this step's own forwards (at the old weights, before the
        step) are the old policy, each token weighted by TIS against the sampler (`tis_cap`).

        Sequences with advantage 0 add exactly 0 to the surrogate's gradient, so without a KL term in
        the loss they are skipped (no forward, no backward); they still count in the normaliser, so
        the update equals the one over the whole mini-batch.
        """
        a = self.algo
        # Across processes the batch is the union of every rank's part (rlvr.distributed).
        tokens, sequences = distributed.global_sum([float(batch.loss_mask.sum()), float(len(batch))])
        norm = Normaliser(tokens=int(tokens), sequences=int(sequences), max_tokens=self.max_tokens)
        rows = torch.arange(len(batch))
        if a.kl.coef == 0:
            rows = rows[batch.advantages != 0]
        self.optimizer.zero_grad(set_to_none=True)
        out = dict.fromkeys(("loss", "kl", "clipped", "tokens", "mismatch_sum", "mismatch_max"), 0.0)
        scorer, model, device = self.scorer, self.policy.model, self.policy.device
        for sel in scorer.micro_batches(rows):
            if sel is None:  # nothing left here: a forward and backward at zero weight, to match theirs
                logp, _, _ = scorer.forward(model, scorer.idle)
                (logp.sum() * 0.0).backward()
                continue
            part = batch.select(sel)
            logp, mask, width = scorer.forward(model, part)  # [n, t]
            sampler = part.old_logprobs[:, : width - 1].to(device)  # [n, t]
            if anchor is None:  # the learner's own old logprobs: these, before the step (no gradient)
                old = logp.detach()
                weight = tis_weight(old, sampler, mask, self.tis_cap)
            else:
                old = anchor[sel, : width - 1].to(device)
                weight = None if tis is None else tis[sel, : width - 1].to(device)
            loss, stats = policy_loss(logp, old, None if ref is None else ref[sel, : width - 1].to(device),
                                      part.advantages.to(device), mask, self.objective, norm, weight)
            (loss * distributed.world_size()).backward()  # FSDP2 averages the ranks' gradients: undo it
            out["loss"] += stats.loss
            out["kl"] += stats.kl / max(norm.tokens, 1)
            out["clipped"] += stats.clipped
            out["tokens"] += stats.tokens
            gap = (logp.detach() - sampler).abs() * mask
            out["mismatch_sum"] += float(gap.sum())
            out["mismatch_max"] = max(out["mismatch_max"], float(gap.max()) if gap.numel() else 0.0)
        out["grad_norm"] = self._clip_gradients()
        out["sequences"] = float(len(rows))
        if distributed.world_size() > 1:  # the whole batch's figures
            summed = ("loss", "kl", "clipped", "tokens", "mismatch_sum", "sequences")
            out.update(zip(summed, distributed.global_sum([out[k] for k in summed]), strict=True))
            out["mismatch_max"] = distributed.global_max(out["mismatch_max"])
        out["skipped"] = float(not self._step_or_skip(out["loss"], out["grad_norm"]))
        return out

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

    def imitate(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of the cold start on `batch` (demonstrations; `loss_mask` marks the
        assistant's tokens): `sft_loss`, the token mean over the whole batch, accumulated over
        micro-batches."""
        tokens, sequences = distributed.global_sum([float(batch.loss_mask.sum()), float(len(batch))])
        norm = Normaliser(tokens=int(tokens), sequences=int(sequences), max_tokens=self.max_tokens)
        scorer, model = self.scorer, self.policy.model
        scorer.tokens = 0
        self.optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for sel in scorer.micro_batches(torch.arange(len(batch))):
            if sel is None:  # nothing left here: a forward and backward at zero weight, to match theirs
                logp, _, _ = scorer.forward(model, scorer.idle)
                (logp.sum() * 0.0).backward()
                continue
            logp, mask, _ = scorer.forward(model, batch.select(sel))
            part, _ = sft_loss(logp, mask, norm)
            (part * distributed.world_size()).backward()  # FSDP2 averages the ranks' gradients: undo it
            loss += float(part.detach())
        grad_norm = self._clip_gradients()
        loss = distributed.global_sum([loss])[0]
        lr = self.scheduler.get_last_lr()[0]
        stepped = self._step_or_skip(loss, grad_norm)
        self.scheduler.step()
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "learn/sequences": sequences,
                "learn/target_tokens": tokens, "learn/skipped_updates": float(not stepped),
                "learn/tokens": distributed.global_sum([float(scorer.tokens)])[0]}

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
