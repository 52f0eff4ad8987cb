"""Rollout engines (`engine`: the interface and the choice of backend; `vllm_engine`, `hf_engine`) and
the multi-turn loop with tools (`multiturn`)."""

from __future__ import annotations


def request_seeds(seed: int | list[int], count: int, n: int) -> list[int]:
    """The seed of each of `count` requests of `n` samples (vLLM seeds sample j of a request with its
    seed + j): `seed + i * n` for request i, or `seed[i]` when the caller chose them."""
    if isinstance(seed, int):
        return [seed + i * n for i in range(count)]
    if len(seed) != count:
        raise ValueError(f"{len(seed)} seeds for {count} prompts")
    return list(seed)
