"""The PyTorch side: the policy, its optimizer, logprobs, and one policy-gradient update."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.algorithms.losses import Normaliser, aggregate, clipped_surrogate, kl_penalty
from rlvr.models import ModelError
from rlvr.types import Batch, Rollout

log = logging.getLogger(__name__)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """Logprobs [N, T-1] of tokens 1.. of `input_ids` [N, T] under `model`, in one batched forward."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, :-1].float() / temperature  # [N, T-1, V]; position t predicts token t+1
    targets = input_ids[:, 1:].unsqueeze(-1)  # [N, T-1, 1]
    return logits.gather(-1, targets).squeeze(-1) - logits.logsumexp(dim=-1)


def make_batch(rollouts: list[Rollout], advantages: list[float], pad_id: int) -> Batch:
    """Right-padded tensors of prompt + completion for every rollout."""
    seqs = [r.prompt_ids + r.completion_ids for r in rollouts]
    n, t = len(seqs), max(len(s) for s in seqs)
    input_ids = torch.full((n, t), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, t), dtype=torch.long)
    loss_mask = torch.zeros((n, t - 1))
    old_logprobs = torch.zeros((n, t - 1))
    for i, (r, s) in enumerate(zip(rollouts, seqs, strict=True)):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
        loss_mask[i, p - 1 : p - 1 + c] = 1  # target position p-1 scores the first completion token
        old_logprobs[i, p - 1 : p - 1 + c] = torch.tensor(r.sampler_logprobs)
    return Batch(input_ids, attention_mask, loss_mask, old_logprobs, torch.tensor(advantages, dtype=torch.float32))


class Learner:
    """A transformers causal LM trained with AdamW; a frozen copy serves as the KL reference when used."""

    def __init__(self, model_path: Path, model_cfg: DictConfig, optim: DictConfig, algorithm: DictConfig,
                 trainer: DictConfig, temperature: float, max_tokens: int, device: str):
        try:
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, model_cfg.dtype))
        except (OSError, ValueError) as e:
            raise ModelError(f"model.path={str(model_path)!r} cannot be loaded as a causal LM: {e}") from e
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.device = device
        self.model.to(device).train()
        self.algo, self.optim_cfg, self.trainer = algorithm, optim, trainer
        self.temperature, self.max_tokens = temperature, max_tokens
        self.ref = None
        if algorithm.kl.coef > 0:  # only built when used
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        warmup = optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights, by the names of its Hugging Face checkpoint (what vLLM loads)."""
        return ((name, p.detach()) for name, p in self.model.state_dict().items())

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Logprobs [len - 1] of tokens 1.. of one sequence at temperature 1 (for the canary)."""
        ids = torch.tensor([token_ids], device=self.device)
        return token_logprobs(self.model, ids, torch.ones_like(ids))[0]

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on `batch`: clipped surrogate (+ KL), accumulated over micro-batches.

        Sequences with advantage 0 add exactly 0 to the surrogate's gradient, so without a KL
        term they are skipped (no forward, no backward); they still count in the normaliser, so
        the update equals the one over the whole batch.
        """
        a = self.algo
        norm = Normaliser(tokens=int(batch.loss_mask.sum()), sequences=len(batch), max_tokens=self.max_tokens)
        rows = torch.arange(len(batch))
        if self.ref is None:
            rows = rows[batch.advantages != 0]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = kl_sum = clipped = tokens = 0.0
        mismatch_sum, mismatch_max = 0.0, 0.0
        for start in range(0, len(rows), self.trainer.micro_batch_size):
            part = batch.select(rows[start : start + self.trainer.micro_batch_size])
            width = int(part.attention_mask.sum(dim=1).max())  # drop columns that are padding in every row
            ids, attn = part.input_ids[:, :width].to(self.device), part.attention_mask[:, :width].to(self.device)
            mask = part.loss_mask[:, : width - 1].to(self.device)  # [n, t]
            old = part.old_logprobs[:, : width - 1].to(self.device)  # [n, t]
            logp = token_logprobs(self.model, ids, attn, self.temperature)  # [n, t]
            per_token, was_clipped = clipped_surrogate(logp, old, part.advantages.to(self.device),
                                                       a.clip_eps_low, a.clip_eps_high)
            if self.ref is not None:
                with torch.no_grad():
                    ref_logp = token_logprobs(self.ref, ids, attn, self.temperature)
                kl = kl_penalty(logp, ref_logp, a.kl.estimator)
                per_token = per_token + a.kl.coef * kl
                kl_sum += float((kl.detach() * mask).sum())
            loss = aggregate(per_token, mask, a.loss_agg, norm)
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += float((was_clipped * mask).sum())
            tokens += float(mask.sum())
            # Before the update the learner holds the sampler's weights: any gap is engine/learner mismatch.
            gap = (logp.detach() - old).abs() * mask
            mismatch_sum += float(gap.sum())
            mismatch_max = max(mismatch_max, float(gap.max()) if gap.numel() else 0.0)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.max_grad_norm))
        lr = self.scheduler.get_last_lr()[0]  # the rate this update uses
        stepped = math.isfinite(grad_norm) and math.isfinite(loss_sum)
        if stepped:
            self.optimizer.step()
            self.scheduler.step()
        else:
            log.warning("non-finite loss (%s) or gradient norm (%s): update skipped", loss_sum, grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": loss_sum,
            "kl": kl_sum / norm.tokens if self.ref is not None and norm.tokens else None,
            "clip_frac": clipped / tokens if tokens else 0.0,
            "grad_norm": grad_norm,
            "lr": lr,
            "learn/sequences": float(len(rows)),
            "learn/skipped_update": float(not stepped),
            "mismatch/logprob_abs_mean": mismatch_sum / tokens if tokens else 0.0,
            "mismatch/logprob_abs_max": mismatch_max,
        }

    def save(self, path: Path) -> None:
        """The policy as a Hugging Face folder (safetensors + tokenizer), loadable by transformers and vLLM."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
