"""The learner across processes (torch.distributed): FSDP2 sharding and the few collectives the
update needs. Not yet wired into `rlvr train` (README, "Scaling out": what exists and what does not).

With a process group initialised (torchrun, or `init_process_group` in a test), each rank holds a
shard of every weight (`fully_shard` per decoder layer, then the root) and trains on its own part of
the batch. The update is the one a single process would make on the whole batch:

- the loss normaliser counts tokens and sequences over all ranks (`global_sum`), so each rank's loss
  is its share of the whole batch's loss; FSDP2 averages gradients over ranks, so each rank
  backpropagates its share times the world size (gloo has no pre-multiplied sum to avoid that);
- every rank runs the same number of forward and backward passes (`global_max` of its micro-batch
  count; a rank with nothing left runs one row at zero weight): the all-gathers of FSDP2 must match;
- the gradient norm that clipping uses is the norm of the whole gradient (DTensor).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


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


def shard(model: torch.nn.Module) -> None:
    """FSDP2 over the process group: each decoder layer a unit of its own, then the root (embeddings,
    final norm, LM head); gradients averaged across ranks (FSDP2's default)."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"sharding needs a decoder with model.layers; {type(model).__name__} has none")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly) sharded one; every rank must call this in the same order."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
