"""The learner across two processes (gloo, FSDP2, tiny model) makes the update one process makes on
the whole batch: the same loss, gradient norm and weights after the step."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from rlvr.learner import Learner, make_batch
from rlvr.types import Prompt, Rollout

from .conftest import compose_config

pytestmark = pytest.mark.slow

# 4 groups of 2; group 1 has advantage 0 (not run), so rank 0 (groups 0-1) has one micro-batch of 2
# rows to run and rank 1 (groups 2-3) two: the ranks must still run matching passes.
ADVANTAGES = [1.0, -1.0, 0.0, 0.0, 0.5, -0.5, 2.0, -2.0]


def _batch(pad_id: int):
    rng = random.Random(0)
    rollouts = []
    for g in range(4):
        prompt = [rng.randrange(3, 500) for _ in range(5 + g)]
        for _ in range(2):
            n = rng.randrange(3, 10)
            rollouts.append(Rollout(prompt=Prompt([], ""), group=g, prompt_ids=prompt,
                                    completion_ids=[rng.randrange(3, 500) for _ in range(n)],
                                    sampler_logprobs=[-rng.uniform(4, 8) for _ in range(n)], text="",
                                    finish_reason="stop"))
    batch = make_batch(rollouts, pad_id)
    batch.advantages = torch.tensor(ADVANTAGES)
    return batch


def _learner(cfg, tiny_path):
    return Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.trainer, cfg.rollout.temperature, cfg.rollout.max_tokens,
                   "cpu")


def _rank(rank: int, world: int, init_file: str, cfg, tiny_path: Path, out: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    learner = _learner(cfg, tiny_path)
    batch = _batch(learner.pad_id)
    stats = learner.step(batch.select(slice(rank * 4, rank * 4 + 4)))
    weights = {name: t.clone() for name, t in learner.named_weights()}  # collective: every rank calls it
    if rank == 0:
        torch.save({"stats": stats, "weights": weights}, out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # past a gloo backward, a normal interpreter exit sometimes aborts (DISTRIBUTED.md)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_two_ranks_make_the_single_process_update(shared_prefix, tmp_path, cache_dir, tiny_path):
    import torch.multiprocessing as mp

    cfg = compose_config(["model=tiny", "optim.lr=1e-3", "trainer.micro_batch_size=2", "algorithm.clip_eps_low=0.1",
                          f"trainer.shared_prefix={str(shared_prefix).lower()}"], cache_dir)
    out = tmp_path / "rank0.pt"
    mp.start_processes(_rank, args=(2, str(tmp_path / "init"), cfg, tiny_path, out), nprocs=2, start_method="spawn")
    two = torch.load(out)

    torch.manual_seed(0)
    learner = _learner(cfg, tiny_path)
    before = {name: t.clone() for name, t in learner.named_weights()}
    one = learner.step(_batch(learner.pad_id))
    for key in ("loss", "grad_norm", "clip_frac", "learn/sequences"):
        assert two["stats"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    moved = 0.0
    for name, weight in learner.named_weights():
        assert torch.allclose(two["weights"][name], weight, atol=1e-6), name
        moved = max(moved, float((weight - before[name]).abs().max()))
    assert moved > 1e-4  # the step did change the weights
