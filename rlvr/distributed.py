"""rlvr across processes (torch.distributed): the split of the rollouts, FSDP2 sharding and the few
collectives the loop needs (docs/scaling.md; the launch of the ranks: rlvr.launch).

Every rank runs the whole loop of `rlvr.train.train` with its own rollout engine:

- each rank generates the groups of its contiguous share of the step's prompts, seeded as one
  process would seed them (request i of a call gets seed + i * n), then every rank receives every
  rollout (`split`): rewards, advantages, metrics and the curriculum are computed alike on every
  rank, and a run of N ranks samples exactly what a run of one samples;
- the learner trains each rank on its share of the groups;
- rank 0 alone writes the run dir (metrics, samples, checkpoints, the final model).

The learner: each rank holds a shard of every weight (`fully_shard` per decoder layer, then the
root) and trains on its own part of the batch. The update is the one a single process would make on
the whole batch:

- the loss normaliser counts tokens and sequences over all ranks (`global_sum`), so each rank's loss
  is its share of the whole batch's loss; FSDP2 averages gradients over ranks, so each rank
  backpropagates its share times the world size (gloo has no pre-multiplied sum to avoid that);
- every rank runs the same number of forward and backward passes (`global_max` of its micro-batch
  count; a rank with nothing left runs one row at zero weight): the all-gathers of FSDP2 must match;
- the gradient norm that clipping uses is the norm of the whole gradient (DTensor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def timed_out(error: BaseException) -> bool:
    """Whether `error` is a collective's timeout: another rank never joined it (gloo and NCCL say so
    only in their messages). Nothing that catches errors may swallow one: the run must end."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timeout" in text or "timed out" in text)


def share(n: int) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous share of `n` items (the first ranks get one less when
    `n` does not divide)."""
    w, r = world_size(), rank()
    return n * r // w, n * (r + 1) // w


def gather(items: list[T]) -> list[T]:
    """Every rank's `items`, concatenated in rank order, on every rank (`items` in a single process)."""
    if world_size() == 1:
        return items
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def on_rank0(fn: Callable[..., T], *args) -> T:
    """`fn(*args)` on rank 0 alone (a write into the run dir); its result, or the error it raised,
    reaches every rank, so that all ranks go on (or stop) together."""
    result, error = None, None
    if rank() == 0:
        try:
            result = fn(*args)
        except Exception as e:
            error = e
    if world_size() > 1:
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
    if error is not None:
        raise error
    return result


def split(generate: Callable) -> Callable:
    """A `Generate` (rlvr.rollout.multiturn) over the world: each rank generates its share of the
    prompts, seeded as the whole call would be in one process, and returns everyone's rollouts."""
    if world_size() == 1:
        return generate

    def generate_share(prompts, prompt_ids, n, seed, greedy=False, context=""):
        start, stop = share(len(prompts))
        mine = generate(prompts[start:stop], prompt_ids[start:stop], n, seed + start * n, greedy=greedy,
                        context=context) if stop > start else []
        for r in mine:
            r.group += start
        return gather(mine)

    return generate_share


def global_sum(values: list[float]) -> list[float]:
    """`values` summed over ranks (themselves in a single process)."""
    if world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def global_max(value: float) -> float:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def shard(model: torch.nn.Module, layers: list[torch.nn.Module]) -> None:
    """FSDP2 over the process group: each of the model's decoder `layers` (rlvr.modeling.kernels.decoder_layers)
    a unit of its own, then the root (embeddings, final norm, LM head); gradients averaged across ranks
    (FSDP2's default)."""
    from torch.distributed.fsdp import fully_shard

    if not layers:
        raise ValueError(f"sharding needs the model's decoder layers; {type(model).__name__} names none "
                         "(_no_split_modules)")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def reshard(model: torch.nn.Module) -> None:
    """Put a sharded model's weights back into their shards. FSDP2 keeps the root unit (embeddings, final
    norm) gathered after a forward, with plain tensors in the module's place of its DTensors; code that
    maps the optimizer's parameters to the model's (its state dict) needs the DTensors there."""
    if hasattr(model, "reshard"):
        model.reshard()


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly) sharded one; every rank must call this in the same order."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
