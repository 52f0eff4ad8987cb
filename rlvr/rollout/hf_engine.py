"""The transformers rollout engine (`rollout.backend=transformers`): batched sampling with the
Hugging Face model on the learner's device (CPU, CUDA or Apple's MPS), where vLLM is not installed.

It keeps a copy of the policy of its own, in the engine's dtype, that each sync overwrites: the
canary therefore compares two sets of weights and two code paths (the learner's full forward, the
engine's token-by-token decoding with a KV cache), and a skipped or corrupt sync shows as with vLLM.
There is no prefix cache across calls; within a call each distinct prompt is forwarded once and its
keys and values are copied to its samples' rows, every row padded on the left to the longest prompt.
Sampling is plain ancestral sampling from softmax(logits / temperature) (training uses top_p = 1),
by inverse CDF with one uniform draw per token from the sample's own generator, seeded as the
`Engine` interface says: runs repeat exactly on one machine (not across backends: the two draw
differently from the same seed).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from rlvr.config import RolloutConfig
from rlvr.errors import EngineError, WeightSyncError
from rlvr.modeling.kernels import attention_kernels
from rlvr.modeling.logprobs import token_logprobs
from rlvr.records import Prompt, Rollout
from rlvr.rollout import request_seeds
from rlvr.rollout.fingerprint import digest, window

# Rows (samples) decoded together; a call with more runs in chunks of this many, so that the KV cache
# of a large evaluation (prompts x eval.n_samples) stays bounded.
ROWS_PER_BATCH = 256
# Last tokens of a row decoded to look for a stop string (one the tokenizer spells in at most this many).
STOP_WINDOW = 16


class TransformersEngine:
    """A Hugging Face causal LM serving the current policy (the `rlvr.rollout.engine.Engine` interface)."""

    def __init__(self, model_path: Path, cfg: RolloutConfig, dtype: str, seed: int, device: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg, self.device = cfg, device
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = self.model.config.eos_token_id if eos is None else eos
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = self.model.generation_config.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos, default=0)
        # Per-sample generators live on CUDA there (sampling stays on the GPU), else on the CPU.
        self.generator_device = "cuda" if torch.device(device).type == "cuda" else "cpu"

    def generate(self, prompts: list[Prompt], prompt_ids: list[list[int]], n: int, seed: int | list[int],
                 greedy: bool = False, context: str = "", stop: list[str] | None = None,
                 max_tokens: list[int] | None = None) -> list[Rollout]:
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        seeds = request_seeds(seed, len(prompts), n)
        out = []
        try:
            for start in range(0, len(rows), ROWS_PER_BATCH):
                chunk = rows[start : start + ROWS_PER_BATCH]
                distinct = sorted({i for i, _ in chunk})
                out += self._decode([prompt_ids[i] for i in distinct], [distinct.index(i) for i, _ in chunk],
                                    [seeds[i] + j for i, j in chunk], temperature=self.cfg.temperature,
                                    max_new=[self.cfg.max_tokens if max_tokens is None else max_tokens[i]
                                             for i, _ in chunk], greedy=greedy, stop=stop)
        except Exception as e:
            first = prompts[0].messages[-1]["content"][:200] if prompts and prompts[0].messages else ""
            raise EngineError(f"the transformers engine failed {context} on {len(prompts)} prompts x {n} samples "
                              f"(first prompt: {first!r}): {type(e).__name__}: {e}") from e
        return [Rollout(prompt=prompts[i], group=i, prompt_ids=prompt_ids[i], completion_ids=ids,
                        sampler_logprobs=logprobs, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                        finish_reason=reason)
                for (i, _), (ids, logprobs, reason) in zip(rows, out, strict=True)]

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], row_prompt: list[int], seeds: list[int], temperature: float,
                max_new: list[int], greedy: bool = False, ignore_eos: bool = False,
                stop: list[str] | None = None) -> list[tuple[list[int], list[float], str]]:
        """Decode one row per entry of `row_prompt` (an index into `prompts`) to eos, a `stop` string
        or its `max_new[row]` tokens: (token ids, their logprobs, finish reason) per row.

        Each distinct prompt is forwarded once and its keys and values are copied out to its rows.
        Prompts are left-padded to one width; positions count real tokens only, so a row computes as
        it would alone (up to float rounding)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        out = self._forward(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                            use_cache=True, logits_to_keep=1)
        index = torch.tensor(row_prompt, device=self.device)
        past = out.past_key_values
        past.reorder_cache(index)  # [prompts, ...] -> [rows, ...]
        logits, mask = out.logits[index, -1], mask[index]
        positions = mask.sum(-1, keepdim=True)  # the next token's position in each row
        generators = [torch.Generator(self.generator_device).manual_seed(s) for s in seeds]
        b = len(row_prompt)
        tokens: list[list[int]] = [[] for _ in range(b)]
        logprobs: list[list[float]] = [[] for _ in range(b)]
        reasons: list[str | None] = [None] * b
        chosen: list[int] = []
        for step in range(max(max_new)):
            if step:
                ids = torch.tensor([[t if reasons[r] is None else self.pad_id] for r, t in enumerate(chosen)],
                                   device=self.device)
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=self.device)], dim=1)
                out = self._forward(input_ids=ids, attention_mask=mask, position_ids=positions,
                                    past_key_values=past, use_cache=True)
                past, logits, positions = out.past_key_values, out.logits[:, -1], positions + 1
            lp = (logits.float() if greedy else logits.float() / temperature).log_softmax(-1)
            chosen_t = lp.argmax(-1) if greedy else self._sample(lp, generators)
            picked = lp.gather(-1, chosen_t[:, None])[:, 0].tolist()
            chosen = chosen_t.tolist()
            for r in range(b):
                if reasons[r] is None:
                    tokens[r].append(chosen[r])
                    logprobs[r].append(picked[r])
                    if chosen[r] in self.eos and not ignore_eos:
                        reasons[r] = "stop"
                    elif stop and any(s in self.tokenizer.decode(tokens[r][-STOP_WINDOW:]) for s in stop):
                        reasons[r] = "stop"
                    elif len(tokens[r]) == max_new[r]:
                        reasons[r] = "length"
            if all(reasons):
                break
        return [(t, lp, reason or "length") for t, lp, reason in zip(tokens, logprobs, reasons, strict=True)]

    def _forward(self, **inputs):
        """The model on `inputs`, with the attention kernels of `self.device`: the prompt width changes
        with every call, which cuDNN's attention pays for on CUDA (rlvr.modeling.kernels.SDPA_BACKENDS)."""
        with attention_kernels(self.device):
            return self.model(**inputs)

    def _sample(self, logprobs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """One token per row [b] from softmax rows `logprobs` [b, V], row r driven by `generators[r]`:
        inverse-CDF sampling with one uniform draw per row (a multinomial per row took ~5x longer)."""
        u = torch.cat([torch.rand(1, generator=g, device=self.generator_device, dtype=torch.float64)
                       for g in generators])
        # in float64 on the generators' device (MPS has no float64: there the CPU)
        cdf = logprobs.to(self.generator_device).double().exp().cumsum(-1)
        u = u * cdf[:, -1]  # the sum is 1 up to rounding: scale the draw rather than trust it
        chosen = torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp(max=logprobs.shape[-1] - 1)
        return chosen.to(logprobs.device)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the learner's weights into the engine's model (cast to its dtype)."""
        own = self.model.state_dict()  # tied weights appear under both names, sharing one tensor
        for name, tensor in named_tensors:
            if name not in own:
                raise WeightSyncError(f"the learner sent weight {name!r}, which the engine's model does not have")
            own[name].copy_(tensor)

    @torch.no_grad()
    def sequence_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([token_ids], device=self.device)
        with attention_kernels(self.device):
            return token_logprobs(self.model, ids, torch.ones_like(ids))[0].float().cpu()

    def sample_continuation(self, token_ids: list[int], n_new: int,
                            seed: int = 0) -> tuple[list[int], torch.Tensor, int]:
        ids, logprobs, _ = self._decode([token_ids], [0], [seed], temperature=1.0, max_new=[n_new], ignore_eos=True)[0]
        return ids, torch.tensor(logprobs), 0  # no prefix cache

    def weight_digests(self, offset: int) -> dict[str, str]:
        return {name: digest(window(t, offset)) for name, t in self.model.state_dict().items()}

    def block_size(self) -> int:
        return 1  # no prefix cache

    def close(self) -> None:
        del self.model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
