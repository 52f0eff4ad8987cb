"""The learner across two processes (gloo, FSDP2, tiny model) makes the update one process makes on
the whole batch: the same loss, gradient norm and weights after the step."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest
import torch

from rlvr import distributed
from rlvr.learner import Learner, make_batch
from rlvr.records import Prompt, Rollout

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
    return Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature, cfg.rollout.max_tokens,
                   "cpu")


def _rank(rank: int, world: int, init_file: str, cfg, tiny_path: Path, out: Path, cut: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    learner = _learner(cfg, tiny_path)
    batch = _batch(learner.policy.pad_id)
    stats = learner.step(batch.select(slice(0, cut) if rank == 0 else slice(cut, len(batch))))
    weights = {name: t.clone() for name, t in learner.policy.named_weights()}  # collective: every rank calls it
    if rank == 0:
        torch.save({"stats": stats, "weights": weights}, out)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # past a gloo backward, a normal interpreter exit sometimes aborts (DISTRIBUTED.md)


# Rank 0 takes the batch's first `cut` rows, rank 1 the rest. cut=0: rank 0 has nothing to learn on (DAPO
# may keep fewer groups than there are ranks) and runs placeholder passes only, here with a KL term too.
@pytest.mark.parametrize(("shared_prefix", "cut", "extra"), [(True, 4, []), (False, 4, []),
                                                          (True, 0, ["algorithm.kl.coef=0.05"])],
                         ids=["shared-prefix", "full-rows", "rank-0-has-nothing"])
def test_two_ranks_make_the_single_process_update(shared_prefix, cut, extra, tmp_path, cache_dir, tiny_path):
    import torch.multiprocessing as mp

    cfg = compose_config(["model=tiny", "optim.lr=1e-3", "learner.micro_batch_size=2", "algorithm.clip_eps_low=0.1",
                          f"learner.shared_prefix={str(shared_prefix).lower()}", *extra], cache_dir)
    out = tmp_path / "rank0.pt"
    mp.start_processes(_rank, args=(2, str(tmp_path / "init"), cfg, tiny_path, out, cut), nprocs=2,
                       start_method="spawn")
    two = torch.load(out)

    torch.manual_seed(0)
    learner = _learner(cfg, tiny_path)
    before = {name: t.clone() for name, t in learner.policy.named_weights()}
    one = learner.step(_batch(learner.policy.pad_id))
    for key in ("loss", "grad_norm", "clip_frac", "learn/sequences"):
        assert two["stats"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    moved = 0.0
    for name, weight in learner.policy.named_weights():
        # Adam's first step is lr * g / (|g| + eps): an entry whose gradient is near eps (1e-8) turns the
        # ranks' other summation order into ~1e-6 of its update (seen with eager attention); 1e-5 is 1 % of lr
        assert torch.allclose(two["weights"][name], weight, atol=1e-5), name
        moved = max(moved, float((weight - before[name]).abs().max()))
    assert moved > 1e-4  # the step did change the weights


def _hang_in_checkpoint(rank: int, joins: int, init_file: str, cfg, tiny_path: Path, run_dir: Path, out: Path):
    """Rank 1 takes part in the first `joins` collectives of a checkpoint, then hangs; rank 0 saves."""
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from rlvr import checkpoint

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=5))
    learner = _learner(cfg, tiny_path)
    if rank == 1:
        if joins:  # the temporary folder's name, broadcast by rank 0; the optimizer's DCP write comes next
            distributed.on_rank0(lambda: None)
        time.sleep(60)
        os._exit(0)
    try:  # (task and rewards: the hang comes before anything reads them)
        result = repr(checkpoint.save_or_report(run_dir, 1, learner, None, None, keep_last=0))
    except BaseException as e:
        result = f"raised {type(e).__name__}: {e}"
    out.write_text(result)
    os._exit(0)


@pytest.mark.parametrize("joins", [0, 1], ids=["at-once", "in-dcp"])
def test_a_rank_hung_in_a_checkpoint_ends_the_run(joins, tmp_path, cache_dir, tiny_path):
    """A collective that times out inside a checkpoint is raised (the launcher then names the hung rank),
    not reported as a failed write that the run goes on from, into the next collective's timeout."""
    import torch.multiprocessing as mp

    cfg = compose_config(["model=tiny"], cache_dir)
    out = tmp_path / "rank0.txt"
    context = mp.start_processes(_hang_in_checkpoint, nprocs=2, start_method="spawn", join=False,
                                 args=(joins, str(tmp_path / "init"), cfg, tiny_path, tmp_path / "run", out))
    try:
        context.processes[0].join(120)  # rank 0 writes its result, then exits; rank 1 sleeps on
    finally:
        for p in context.processes:
            p.kill()
    result = out.read_text()
    assert result.startswith("raised") and distributed.timed_out(RuntimeError(result)), result
    assert not list((tmp_path / "run" / "checkpoints").glob("step-*"))  # nothing half-written in place


# --- `rlvr train` across processes: the launch, the split rollouts, checkpoints, faults ---------------

TRAIN = ["train", "+experiment=multiplication", "model=tiny", "data.batch_size=4", "algorithm.group_size=4",
         "rollout.max_tokens=16", "data.eval_size=12", "optim.lr=1e-3", "trainer.samples_every=0",
         "trainer.log_samples=0"]
COMPARED = ("reward/mean", "accuracy", "completion_len/mean", "groups/zero_adv_frac", "learn/sequences",
            "eval/accuracy", "eval/reward/mean")


def _records(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train_metrics(run_dir: Path) -> dict[int, dict]:
    """Each training step's record (not the evaluations), by step."""
    return {r["step"]: r for r in _records(run_dir) if "loss" in r}


def _same_run(a: Path, b: Path, steps) -> None:
    """The runs in `a` and `b` sampled the same completions and made the same updates at `steps`."""
    ma, mb = _train_metrics(a), _train_metrics(b)
    for step in steps:
        for key in COMPARED:
            if key in ma[step]:
                assert mb[step][key] == ma[step][key], (step, key)  # the same samples, to the token
        for key in ("loss", "grad_norm", "entropy/sampled"):  # the last: mean -log p of every sampled token
            assert mb[step][key] == pytest.approx(ma[step][key], rel=1e-4, abs=1e-6), (step, key)


def _same_weights(a: Path, b: Path) -> dict:
    """The final models of the runs in `a` and `b` agree to 1e-6 in every tensor; `a`'s weights are returned."""
    from safetensors.torch import load_file

    one, other = (load_file(run_dir / "model" / "model.safetensors") for run_dir in (a, b))
    assert one.keys() == other.keys()
    for key in one:
        assert torch.allclose(one[key], other[key], atol=1e-6), (b.name, key)
    return one


def _torchrun(args: list[str], cache: Path, cwd: Path):
    import subprocess
    import sys

    from .conftest import pinned

    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "RLVR_CACHE": str(cache), "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "rlvr.cli", args[0], *pinned(args[1:])],
                          capture_output=True, text=True, timeout=900, env=env, cwd=cwd)


def test_two_ranks_train_as_one_process(tmp_path, cache_dir):
    """`launch.nproc_per_node=2` and `torchrun --nproc_per_node 2` sample exactly what one process samples
    (each rank its share of the prompts, seeded as one process seeds them), make the same updates, write
    one record per step (rank 0 alone) into one run dir, and end with the same model. Both start on an
    empty cache, where the tiny model is built once, whole, whichever way the ranks start (transformers
    writes a model's weights and config on torch.distributed's rank 0 only: each rank building its own
    copy left a folder of tokenizer files alone, and the run failed)."""
    from safetensors.torch import load_file

    from .conftest import run_cli

    runs, caches = {}, {"one": cache_dir, "two": tmp_path / "cache-two", "torchrun": tmp_path / "cache-torchrun"}
    for name, extra in (("one", []), ("two", ["launch.nproc_per_node=2"])):
        runs[name] = tmp_path / name
        result = run_cli([*TRAIN, "trainer.max_steps=2", f"hydra.run.dir={runs[name]}", *extra], caches[name],
                         timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    # under torchrun each rank's Hydra names a run dir of its own (the time in it may differ): rank 0's is used
    result = _torchrun([*TRAIN, "trainer.max_steps=2"], caches["torchrun"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    made = [p.parent for p in (tmp_path / "outputs").glob("*/*/metrics.jsonl")]
    assert len(made) == 1, made
    assert [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()] == made  # no second, empty run dir
    runs["torchrun"] = made[0]
    for name in ("two", "torchrun"):
        models = caches[name] / "models"
        assert sorted(p.name for p in models.iterdir()) == ["tiny"], name
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (models / "tiny").iterdir()}
        records = _records(runs[name])
        assert [r["step"] for r in records] == [0, 1, 2, 2], name  # eval, two steps, final eval: written once
        _same_run(runs["one"], runs[name], steps=(1, 2))
        assert _records(runs[name])[-1]["eval/accuracy"] == _records(runs["one"])[-1]["eval/accuracy"]
        one = _same_weights(runs["one"], runs[name])
    assert any((one[k] != load_file(cache_dir / "models" / "tiny" / "model.safetensors")[k]).any() for k in one)


def test_dapo_on_two_ranks_and_resume_with_another_world_size(tmp_path, cache_dir):
    """DAPO keeps only the groups whose rewards differ: here 1, 3 and 1 of 4 at steps 1-3, so at steps 1
    and 3 rank 0 has no group to learn on; two ranks still make the one-process updates. A checkpoint of
    one process resumes on two ranks and one of two ranks on one process, each continuing exactly as the
    uninterrupted run (the optimizer state included: step 3's update depends on it)."""
    from .conftest import run_cli

    whole, two, resumed, back = tmp_path / "whole", tmp_path / "two", tmp_path / "resumed", tmp_path / "back"
    base = [*TRAIN, "algorithm=dapo", "trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_last=0"]
    for run_dir, extra in ((whole, []), (two, ["launch.nproc_per_node=2", "trainer.save_every=0"]),
                           (resumed, ["launch.nproc_per_node=2", f"trainer.resume={whole}/checkpoints/step-000001"]),
                           (back, [f"trainer.resume={resumed}/checkpoints/step-000002"])):
        result = run_cli([*base, f"hydra.run.dir={run_dir}", *extra], cache_dir, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    assert [_train_metrics(whole)[s]["groups/trained"] for s in (1, 2, 3)] == [1, 3, 1]
    _same_run(whole, two, steps=(1, 2, 3))
    _same_weights(whole, two)
    _same_run(whole, resumed, steps=(2, 3))
    _same_run(whole, back, steps=(3,))


def test_the_cold_start_on_two_ranks_makes_the_one_process_updates(tmp_path, cache_dir):
    """`rlvr sft` on two ranks: 5 demonstrations a step split 3 + 2, micro-batches of 2, so rank 1 runs
    an idle pass to match rank 0's second micro-batch. Each step's loss (the token mean over the whole
    batch), gradient norm and the final weights are those of one process."""
    from .conftest import run_cli

    base = ["sft", *TRAIN[1:], "sft.steps=2", "sft.batch_size=5", "sft.lr=1e-3", "sft.warmup_steps=0",
            "learner.micro_batch_size=2"]
    runs = {"one": tmp_path / "one", "two": tmp_path / "two"}
    for name, extra in (("one", []), ("two", ["launch.nproc_per_node=2"])):
        result = run_cli([*base, f"hydra.run.dir={runs[name]}", *extra], cache_dir, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    one, two = _train_metrics(runs["one"]), _train_metrics(runs["two"])
    assert sorted(one) == sorted(two) == [1, 2]
    for step in (1, 2):
        assert two[step]["learn/target_tokens"] == one[step]["learn/target_tokens"]
        for key in ("loss", "grad_norm"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)
    _same_weights(runs["one"], runs["two"])


def _workers(launcher_pid: int) -> list[int]:
    """The rank processes the launcher spawned (multiprocessing's spawn children, not its resource tracker)."""
    import psutil

    return [p.pid for p in psutil.Process(launcher_pid).children(recursive=True)
            if "spawn_main" in " ".join(p.cmdline())]


def _start(args: list[str], cache: Path, extra_env: dict | None = None):
    import subprocess

    from .conftest import RLVR, pinned

    env = {**os.environ, "RLVR_CACHE": str(cache), "HYDRA_FULL_ERROR": "0", **(extra_env or {})}
    return subprocess.Popen([RLVR, args[0], *pinned(args[1:])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)


def _wait_for_step(run_dir: Path, step: int, process, timeout: float = 900) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not ((run_dir / "metrics.jsonl").is_file() and any(r["step"] >= step and "loss" in r
                                                             for r in _records(run_dir))):
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach its step"
        time.sleep(0.5)


def _wait_for_file(path: Path, process, timeout: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.1)


def _signal_rank_1(sig: int, tmp_path: Path, cache_dir: Path, *overrides: str):
    """Start a 2-rank run that checkpoints every step, send rank 1 `sig` after step 2, and wait for the
    launcher (never a hang: the waits only guard the test). Returns its exit code, output and rank pids."""
    import signal

    import psutil

    run_dir = tmp_path / "run"
    process = _start([*TRAIN, "trainer.max_steps=500", "trainer.save_every=1", "launch.nproc_per_node=2",
                      *overrides, f"hydra.run.dir={run_dir}"], cache_dir)
    workers: list[int] = []
    try:
        _wait_for_step(run_dir, 2, process)
        workers = _workers(process.pid)
        assert len(workers) == 2
        os.kill(max(workers), sig)
        out, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pid in workers:  # a stopped rank left behind (the others are the launcher's to stop: tested)
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
                    os.kill(pid, signal.SIGKILL)
    return process.returncode, out, workers


def test_a_killed_rank_stops_the_group_naming_it(tmp_path, cache_dir):
    """SIGKILL one rank mid-run: the launcher stops the other and exits with one message naming the rank and
    the last complete checkpoint."""
    import signal

    import psutil

    code, out, workers = _signal_rank_1(signal.SIGKILL, tmp_path, cache_dir)
    assert code == 1, out[-3000:]
    assert "was killed by SIGKILL; the other ranks were stopped. The last complete checkpoint is" in out, out[-3000:]
    assert "trainer.resume=auto" in out
    assert not psutil.pid_exists(min(workers)) or psutil.Process(min(workers)).status() == psutil.STATUS_ZOMBIE


def test_a_hung_rank_stops_the_group_within_the_timeout(tmp_path, cache_dir):
    """SIGSTOP one rank mid-run (a hang: alive, silent): the other's next collective gives up after
    launch.dist_timeout_s, and the launcher stops the group with one message naming the hung rank."""
    import signal

    code, out, workers = _signal_rank_1(signal.SIGSTOP, tmp_path, cache_dir, "launch.dist_timeout_s=20")
    assert code == 1, out[-3000:]
    assert (f"rank 0 (pid {min(workers)}) gave up waiting for the other ranks after launch.dist_timeout_s=20 s "
            "(rank 1 of this node never joined that collective: hung?); the other ranks were stopped. "
            "The last complete checkpoint is") in out, out[-3000:]


def _stall_after_step_1(tmp_path: Path, cache_dir: Path, seconds: float):
    """A 2-rank run whose first reward call after step 1 sleeps `seconds` (a long step), with Ctrl-C sent
    to the launcher's terminal once that call has begun. Returns the process, its run dir, rank pids and the
    step that call is part of."""
    import signal

    from .conftest import REPO

    run_dir, gate, started = tmp_path / "run", tmp_path / "gate", tmp_path / "started"
    stall = ["reward=digits", "reward.terms.digits._target_=tests.slow_rewards.stall",
             f"+reward.terms.digits.kwargs.gate={gate}", f"+reward.terms.digits.kwargs.started={started}",
             f"+reward.terms.digits.kwargs.seconds={seconds}"]
    process = _start([*TRAIN, "trainer.max_steps=500", "launch.nproc_per_node=2", "reward.timeout_s=null", *stall,
                      f"hydra.run.dir={run_dir}"], cache_dir, {"PYTHONPATH": str(REPO)})
    _wait_for_step(run_dir, 1, process)
    workers = _workers(process.pid)
    gate.touch()
    _wait_for_file(started, process)
    stalled = max(_train_metrics(run_dir)) + 1
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    return process, run_dir, workers, stalled


def test_ctrl_c_stops_every_rank_after_its_step_with_one_checkpoint(tmp_path, cache_dir):
    """Ctrl-C in a terminal reaches the launcher and each rank: every rank finishes its step, however long
    (here 45 s, past the 30 s after which torch's launcher would kill it), rank 0 writes one checkpoint, and
    the run says how to continue it."""
    import signal

    process, run_dir, _, stalled = _stall_after_step_1(tmp_path, cache_dir, seconds=45)
    try:
        out, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGINT, out[-3000:]
    assert max(_train_metrics(run_dir)) == stalled  # the step that took 45 s was finished, and no other
    assert [s.name for s in (run_dir / "checkpoints").glob("step-*")] == [f"step-{stalled:06d}"], out[-3000:]
    assert "stopped by SIGINT: each rank finished its step. The last complete checkpoint is" in out, out[-3000:]
    assert "trainer.resume=auto" in out


def test_a_second_ctrl_c_stops_every_rank_at_once(tmp_path, cache_dir):
    """Ctrl-C during a step that will not end (a reward sleeps for an hour), then Ctrl-C again: the launcher
    kills the ranks at once and says so; no checkpoint is written for the unfinished step."""
    import signal
    import time

    import psutil

    process, run_dir, workers, stalled = _stall_after_step_1(tmp_path, cache_dir, seconds=3600)
    try:
        deadline = time.monotonic() + 60
        # (the launcher's line: a rank waiting in a collective for the stalled one sees the signal only after it)
        while "passed on to every rank" not in (run_dir / "train.log").read_text():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)
        out, _ = process.communicate(timeout=60)
        alive = [pid for pid in workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pid in workers:  # (ranks a failing test would leave behind)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "stopped by a second SIGINT: the ranks were stopped at once" in out, out[-3000:]
    assert alive == []
    assert max(_train_metrics(run_dir)) == stalled - 1  # the step in progress was dropped
    assert not list(run_dir.glob("checkpoints/step-*"))


def test_the_slurm_script_composes_a_run_across_nodes(tmp_path):
    """scripts/slurm.sbatch, run with stand-ins for Slurm's `srun` and `scontrol` (Slurm cannot run here) and for
    `rlvr`: on node 1 of 2 it asks for a config that composes and passes the checks, with every node meeting at the
    first node of the job and writing into one run dir."""
    import subprocess

    from rlvr.config import check

    from .conftest import REPO, compose_config

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'gpu-a17\\ngpu-a18\\n'\n")
    (bin_dir / "srun").write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=1 exec \"$@\"\n")
    args = tmp_path / "args"
    (bin_dir / "rlvr").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {args}\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RLVR": str(bin_dir / "rlvr"),
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242", "SLURM_GPUS_ON_NODE": "8"}
    result = subprocess.run(["bash", str(REPO / "scripts" / "slurm.sbatch"), "+experiment=multiplication",
                             "optim.lr=3e-6", "data.batch_size=64", "logger.name=my run"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    command, *overrides = args.read_text().splitlines()
    assert command == "train"
    assert "hydra.run.dir=outputs/slurm-4242" in overrides
    cfg = compose_config([o for o in overrides if not o.startswith("hydra.")])
    check(cfg)
    t = cfg.launch
    assert (t.nproc_per_node, t.nnodes, t.node_rank, t.rdzv_endpoint) == (8, 2, 1, "gpu-a17:29500")
    assert cfg.optim.lr == 3e-6 and cfg.data.batch_size == 64
    assert cfg.logger.name == "my run"  # an override with a space arrives as one argument


def test_what_cannot_run_across_processes_fails_at_start(tmp_path, cache_dir):
    """LoRA across processes is refused by the launcher itself, before any rank starts, naming the key."""
    from .conftest import cli_here

    result = cli_here([*TRAIN, "launch.nproc_per_node=2", "model.lora.r=8", f"hydra.run.dir={tmp_path / 'run'}"],
                     cache_dir)
    assert result.returncode == 1
    assert "model.lora.r: LoRA is not supported across processes yet" in result.stderr
    assert "launching" not in result.stderr and not (tmp_path / "run").exists()
