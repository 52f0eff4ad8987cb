"""The PyTorch side: the policy, its optimizer, logprobs, and one policy-gradient update."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr import distributed
from rlvr.algorithms.losses import Normaliser, tis_weight
from rlvr.algorithms.objective import PolicyLossConfig, policy_loss
from rlvr.config import AlgorithmConfig, LearnerConfig, LoraConfig, OptimConfig
from rlvr.kernels import attention_kernel, attention_kernels, compile_choice, compile_layers, decoder_layers
from rlvr.logprobs import token_logprobs
from rlvr.lora import merged_weights, with_adapters
from rlvr.models import ModelError
from rlvr.precision import Precision
from rlvr.shared_prefix import TESTED, packed_shape, shared_prefix_logprobs
from rlvr.types import Batch, Prompt, Rollout

log = logging.getLogger(__name__)


def make_batch(rollouts: list[Rollout], pad_id: int, mask_truncated: bool = False) -> Batch:
    """Right-padded tensors of prompt + completion for every rollout; advantages are zero until set.

    `mask_truncated` drops completions cut at max_tokens out of the loss (DAPO's overlong filtering).
    Adjacent rollouts with the same prompt form one group (the shared-prefix learner forwards it once).
    """
    seqs = [r.prompt_ids + r.completion_ids for r in rollouts]
    n, t = len(seqs), max((len(s) for s in seqs), default=1)  # (no rollouts: a rank with no share of a step)
    input_ids = torch.full((n, t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, t), dtype=torch.long)
    loss_mask = torch.zeros((n, t - 1))
    old_logprobs = torch.zeros((n, t - 1))
    for i, (r, s) in enumerate(zip(rollouts, seqs, strict=True)):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
        if not (mask_truncated and r.finish_reason == "length"):
            # target position p-1 scores the first completion token; tool results stay out of the loss
            loss_mask[i, p - 1 : p - 1 + c] = torch.tensor(r.model_mask, dtype=loss_mask.dtype)
        old_logprobs[i, p - 1 : p - 1 + c] = torch.tensor(r.sampler_logprobs)
    new_group = [int(i > 0 and r.prompt_ids != rollouts[i - 1].prompt_ids) for i, r in enumerate(rollouts)]
    groups = torch.tensor(new_group, dtype=torch.long).cumsum(0)  # [N]
    return Batch(input_ids, attention_mask, loss_mask, old_logprobs, torch.zeros(n),
                 torch.tensor([len(r.prompt_ids) for r in rollouts]), groups)


def shared_prefix_choice(setting: str | bool, model_type: str, group_size: int) -> tuple[bool, str]:
    """Whether the learner forwards each group's prompt once (`learner.shared_prefix`), and why."""
    if setting is True or setting is False:
        return setting, "as configured"
    if model_type not in TESTED:
        return False, f"not tested on {model_type!r} models (tested: {', '.join(TESTED)})"
    return True, f"a {model_type} model; each prompt is forwarded once instead of {group_size} times"


def load_policy(model_path: Path):
    """The causal LM in `model_path` with float32 weights, and its tokenizer (which must have a chat template)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ModelError(f"model.path={str(model_path)!r} cannot be loaded as a causal LM: {e}") from e
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.chat_template is None:
        raise ModelError(f"the tokenizer of model.path={str(model_path)!r} has no chat template; the task's "
                         "prompts are chat messages. Use an instruct/chat model or add a chat_template.")
    return model, tokenizer


def tied_names(model: torch.nn.Module) -> set[str]:
    """Names of weights tied to another (an LM head that is the embedding): a checkpoint holds them once."""
    return ({n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()})


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
    `precision` bf16-mixed); a frozen copy serves as the KL reference when used."""

    def __init__(self, model_path: Path, optim: OptimConfig, algorithm: AlgorithmConfig, learner: LearnerConfig,
                 temperature: float, max_tokens: int, device: str, precision: Precision | None = None,
                 reference_path: Path | None = None, lora: LoraConfig | None = None,
                 adapter_path: Path | None = None):
        """`model_path`: the policy to train (a resumed run's checkpoint); `reference_path`: the initial
        model a KL term is measured against (default: `model_path`); `precision`: fp32 when None.
        With `lora` (`model.lora`, r > 0), `model_path` is the frozen base and adapters train on it,
        starting from those saved in `adapter_path` when given (a resumed run)."""
        # Built in stages: load -> wrap (LoRA adapters, or FSDP2 shards across processes) -> optimizer.
        self.model, self.tokenizer = load_policy(model_path)
        self.lora = lora is not None and lora.r > 0
        self.tied = tied_names(self.model)
        self.model = self._wrap(self.model, lora, adapter_path, device)
        self.device = device
        self.algo, self.optim_cfg, self.learner = algorithm, optim, learner
        self.temperature, self.max_tokens = temperature, max_tokens
        # The KL reference: with LoRA the base model with its adapters switched off, else a frozen copy.
        self.ref = None
        if (algorithm.kl.coef > 0 or algorithm.kl.reward_coef > 0) and not self.lora:  # only built when used
            self.ref = AutoModelForCausalLM.from_pretrained(reference_path or model_path, dtype=torch.float32)
            self.ref.to(device).eval().requires_grad_(False)
        self.optimizer, self.scheduler = make_optimizer(self.model, optim)
        self.shared_prefix, why = shared_prefix_choice(learner.shared_prefix, self.model.config.model_type,
                                                       algorithm.group_size)
        self.bf16 = precision is not None and precision.bf16
        self.compiled, compile_why = compile_choice(learner.compile, self.bf16, device)
        if self.compiled:
            compile_layers(self.model)
        # The sampler/learner mismatch is larger in bf16: there the old policy defaults to the learner's
        # own logprobs, with TIS weights capped at 2, unless algorithm.tis_cap says otherwise.
        self.tis_cap = algorithm.tis_cap if algorithm.tis_cap is not None or not self.bf16 else 2.0
        self.objective = PolicyLossConfig.of(algorithm)
        log.info("learner: %s, %s (float32 master weights); shared-prefix forward %s (learner.shared_prefix=%s: "
                 "%s); decoder layers %s (learner.compile=%s: %s)%s", device, "bf16-mixed" if self.bf16 else "fp32",
                 "on" if self.shared_prefix else "off", learner.shared_prefix, why,
                 "compiled, the first step compiling them" if self.compiled else "eager", learner.compile,
                 compile_why, "; TIS cap 2.0 for the bf16 mismatch" if self.tis_cap != algorithm.tis_cap else "")
        self.tokens = 0  # tokens through a model this step (see `step`)
        # Across processes a rank with fewer micro-batches than the others (or none: DAPO may keep fewer
        # groups than there are ranks) runs this one-row batch at zero weight, to match their passes.
        self.idle = make_batch([Rollout(Prompt([], ""), 0, [self.pad_id], [self.pad_id], [0.0], "", "stop")],
                               self.pad_id)

    def _wrap(self, model: torch.nn.Module, lora: LoraConfig | None, adapter_path: Path | None,
              device: str) -> torch.nn.Module:
        """The loaded model as it trains: with LoRA adapters (frozen base), on `device`, and across
        processes sharded by FSDP2 (each rank holding a shard of every weight)."""
        if self.lora:
            model = with_adapters(model, lora, adapter_path)
        model.to(device).train()
        if distributed.world_size() > 1:  # a process group: each rank holds a shard (rlvr.distributed)
            if self.lora:
                raise ModelError("LoRA is not supported across processes yet: use one process, or model.lora.r=0")
            distributed.shard(model, decoder_layers(model))
        return model

    def state_dict(self) -> dict:
        """What a checkpoint's trainer.pt keeps of the learner: its LR schedule. (The weights: `export_weights`;
        AdamW's state, sharded across processes: `save_optimizer`.)"""
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def named_weights(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights, by the names of its Hugging Face checkpoint (what vLLM loads), as copies
        in `dtype` (the engine's) or the float32 masters themselves; with LoRA, merged (base + adapter)."""
        if self.lora:
            return ((name, p.to(dtype)) for name, p in merged_weights(self.model))
        return ((name, distributed.full(p).detach().to(dtype)) for name, p in self.model.state_dict().items())

    def forward_context(self) -> contextlib.ExitStack:
        """What a forward (and its backward) runs under: bf16 autocast under bf16-mixed, and on CUDA
        SDPA without cuDNN's attention (`SDPA_BACKENDS`)."""
        stack = contextlib.ExitStack()
        if self.bf16:
            stack.enter_context(torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16))
        stack.enter_context(attention_kernels(self.device))
        return stack

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Logprobs [len - 1] of tokens 1.. of one sequence at temperature 1 (for the canary), without
        dropout: the deterministic policy the engine serves."""
        ids = torch.tensor([token_ids], device=self.device)
        self._pick_attention(self.model, 1, len(token_ids))  # the same kernel at every check: bit-for-bit logprobs
        self.model.eval()
        try:
            with self.forward_context():
                return token_logprobs(self.model, ids, torch.ones_like(ids))[0]
        finally:
            self.model.train()

    def _pick_attention(self, model: torch.nn.Module, rows: int, width: int) -> None:
        """Switch `model` to the attention kernel for this forward (`attention_kernel`); every attention
        layer reads it at each forward."""
        kernel = attention_kernel(self.device, rows, width, model.config.num_attention_heads)
        if model.config._attn_implementation != kernel:
            model.set_attn_implementation(kernel)

    def _forward(self, model: torch.nn.Module, part: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(logprobs [n, t], loss mask [n, t], width) of a micro-batch, trimmed of all-padding columns."""
        width = int(part.attention_mask.sum(dim=1).max())
        ids, attn = part.input_ids[:, :width].to(self.device), part.attention_mask[:, :width].to(self.device)
        mask = part.loss_mask[:, : width - 1].to(self.device)
        with self.forward_context():  # the logprobs themselves are float32 (target_logprobs)
            if self.shared_prefix:
                lanes, lane_width, tokens = packed_shape(part.attention_mask, part.prompt_lens, part.groups)
                self._pick_attention(model, lanes, lane_width)
                self.tokens += tokens
                return (shared_prefix_logprobs(model, ids, attn, part.prompt_lens.to(self.device),
                                               part.groups.to(self.device), self.temperature), mask, width)
            self._pick_attention(model, len(part), width)
            self.tokens += int(part.attention_mask.sum())
            scored = part.loss_mask[:, : width - 1].any(dim=0).nonzero()  # positions whose logprob anything uses
            start = int(scored[0]) if len(scored) else width - 2
            return token_logprobs(model, ids, attn, self.temperature, start), mask, width

    @torch.no_grad()
    def batch_logprobs(self, batch: Batch, reference: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logprobs [N, T-1] of every target token under the policy (or the frozen reference), no grad;
        only of the sequences `rows` (default: all), the others left at 0."""
        out = torch.zeros_like(batch.old_logprobs)
        rows = torch.arange(len(batch)) if rows is None else rows
        model = self.ref if reference and not self.lora else self.model
        with self.model.disable_adapter() if reference and self.lora else contextlib.nullcontext():
            starts = range(0, len(rows), self.learner.micro_batch_size)
            for k in range(int(distributed.global_max(len(starts)))):  # as many passes as every other rank
                if k >= len(starts):
                    self._forward(model, self.idle)  # nothing left here: a pass to match theirs
                    continue
                sel = rows[starts[k] : starts[k] + self.learner.micro_batch_size]
                logp, _, width = self._forward(model, batch.select(sel))
                out[sel, : width - 1] = logp.cpu()
        return out

    def step(self, batch: Batch) -> dict[str, float]:
        """Train on one batch: `ppo_epochs` passes, each split into `mini_batches` optimizer steps,
        each accumulating gradients over micro-batches of `learner.micro_batch_size` sequences.

        The old policy of the ratio is the sampler's logprobs; with `tis_cap` it is the learner's own
        logprobs before the update, and each token is weighted by min(learner_old / sampler, tis_cap).
        """
        a = self.algo
        self.tokens = 0
        anchor, tis = batch.old_logprobs, None
        # The sequences the update runs: without a KL term, those whose advantage is not zero.
        scored = torch.arange(len(batch)) if a.kl.coef > 0 else torch.nonzero(batch.advantages != 0).flatten()
        # With TIS the old policy is the learner's own logprobs. With one optimizer step per batch, every
        # forward of the update runs at the old weights, so it computes them itself (`_update`, old=None);
        # otherwise a forward before the update does.
        in_forward = self.tis_cap is not None and a.ppo_epochs == 1 and a.mini_batches == 1
        if self.tis_cap is not None and not in_forward:
            anchor = batch.old_logprobs.clone()
            anchor[scored] = self.batch_logprobs(batch, rows=scored)[scored]
            tis = tis_weight(anchor, batch.old_logprobs, batch.loss_mask, self.tis_cap)
        # The frozen reference's logprobs do not change over epochs: one forward for the whole batch.
        ref = self.batch_logprobs(batch, reference=True) if a.kl.coef > 0 else None
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
            "learn/tokens": distributed.global_sum([float(self.tokens)])[0],
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
        starts = range(0, len(rows), self.learner.micro_batch_size)
        for k in range(int(distributed.global_max(len(starts)))):  # as many passes as every other rank
            if k >= len(starts):  # nothing left here: a forward and backward at zero weight, to match theirs
                logp, _, _ = self._forward(self.model, self.idle)
                (logp.sum() * 0.0).backward()
                continue
            sel = rows[starts[k] : starts[k] + self.learner.micro_batch_size]
            part = batch.select(sel)
            logp, mask, width = self._forward(self.model, part)  # [n, t]
            sampler = part.old_logprobs[:, : width - 1].to(self.device)  # [n, t]
            if anchor is None:  # the learner's own old logprobs: these, before the step (no gradient)
                old = logp.detach()
                weight = tis_weight(old, sampler, mask, self.tis_cap)
            else:
                old = anchor[sel, : width - 1].to(self.device)
                weight = None if tis is None else tis[sel, : width - 1].to(self.device)
            loss, stats = policy_loss(logp, old, None if ref is None else ref[sel, : width - 1].to(self.device),
                                      part.advantages.to(self.device), mask, self.objective, norm, weight)
            (loss * distributed.world_size()).backward()  # FSDP2 averages the ranks' gradients: undo it
            out["loss"] += stats.loss
            out["kl"] += stats.kl / max(norm.tokens, 1)
            out["clipped"] += stats.clipped
            out["tokens"] += stats.tokens
            gap = (logp.detach() - sampler).abs() * mask
            out["mismatch_sum"] += float(gap.sum())
            out["mismatch_max"] = max(out["mismatch_max"], float(gap.max()) if gap.numel() else 0.0)
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        out["grad_norm"] = float(distributed.full(torch.nn.utils.clip_grad_norm_(trained, self.optim_cfg.max_grad_norm)))
        out["sequences"] = float(len(rows))
        if distributed.world_size() > 1:  # the whole batch's figures
            summed = ("loss", "kl", "clipped", "tokens", "mismatch_sum", "sequences")
            out.update(zip(summed, distributed.global_sum([out[k] for k in summed]), strict=True))
            out["mismatch_max"] = distributed.global_max(out["mismatch_max"])
        stepped = math.isfinite(out["grad_norm"]) and math.isfinite(out["loss"])
        if stepped:
            self.optimizer.step()
        else:
            log.warning("non-finite loss (%s) or gradient norm (%s): update skipped", out["loss"], out["grad_norm"])
            self.optimizer.zero_grad(set_to_none=True)
        out["skipped"] = float(not stepped)
        return out

    def export_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole policy's float32 weights by their Hugging Face names (with LoRA, merged), on the
        CPU; across processes a collective that every rank calls, returning them on rank 0 alone."""
        if self.lora:
            return dict(merged_weights(self.model))
        if distributed.world_size() == 1:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in weights.items() if k not in self.tied} if distributed.rank() == 0 else None

    def save(self, path: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
        """The policy as a Hugging Face folder (safetensors + tokenizer), loadable by transformers and vLLM;
        with LoRA the merged weights (the adapter alone: `save_adapter`). `weights`: what `export_weights`
        returned (across processes rank 0 writes them; in one process they are taken here if not given)."""
        weights = self.export_weights() if weights is None else weights
        model = self.model.get_base_model() if self.lora else self.model
        model.save_pretrained(path, state_dict=weights)
        self.tokenizer.save_pretrained(path)

    def save_optimizer(self, path: Path) -> None:
        """AdamW's state into the folder `path` with torch.distributed.checkpoint: by parameter name, each
        rank writing its own shards (a collective; one process writes whole tensors). Any number of
        processes loads it back (`load_optimizer`): DCP reshards on load."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        distributed.reshard(self.model)
        try:
            dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}, checkpoint_id=path)
        except dcp.api.CheckpointException as e:  # a BaseException: give the callers what failed, as an OSError
            rank, (error, _) = next(iter(e.failures.items()))
            raise OSError(f"writing the optimizer state failed on rank {rank} (a full disk, or a file size limit?): "
                          f"{type(error).__name__}: {error}") from e

    def load_optimizer(self, path: Path) -> None:
        """Put back the AdamW state `save_optimizer` wrote, whatever world size wrote it (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        distributed.reshard(self.model)
        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}  # the layout to fill
        try:
            dcp.load(state, checkpoint_id=path)
        except dcp.api.CheckpointException as e:
            rank, (error, _) = next(iter(e.failures.items()))
            raise RuntimeError(f"rank {rank}: {type(error).__name__}: {error}") from e
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])

    def save_adapter(self, path: Path) -> None:
        """The LoRA adapter (peft's folder: adapter_config.json, adapter_model.safetensors)."""
        self.model.save_pretrained(path)
