"""Runs that survive: checkpoints, exact resume after a real SIGKILL, graceful SIGTERM and Ctrl-C,
a full disk, a failed checkpoint write, NaN updates, and bad input that fails at start — all with the
real CLI on the tiny model."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr import checkpoint, rundir

from .conftest import GOLDEN, REPO, RLVR, cli_here, pinned, run_cli

pytestmark = pytest.mark.slow

RUN = ["+experiment=multiplication", "model=tiny", "reward=digits", "optim.lr=1e-3", "data.batch_size=2",
       "algorithm.group_size=4", "rollout.max_tokens=16", "data.eval_size=4", "trainer.save_model=false",
       "trainer.log_samples=0"]
STEPS = 6
# The run that is killed and resumed: the golden run's (tests/conftest.py), which the uninterrupted one is.
RESUMED = GOLDEN
# Everything a step computes from its samples; times are left out (they differ run to run).
COMPARED = ["reward/mean", "reward/digits", "accuracy", "completion_len/mean", "loss", "grad_norm", "clip_frac",
            "mismatch/logprob_abs_mean", "sync/logprob_max_diff", "curriculum/level", "kl", "lr"]


def _steps(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "time/step_s" in x]


def _start(args: list[str], cache: Path, extra_env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "RLVR_CACHE": str(cache), **(extra_env or {})}
    return subprocess.Popen([RLVR, "train", *pinned(args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(s["step"] >= step for s in _steps(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"step {step} not reached in {timeout} s")


@pytest.fixture
def reference(golden) -> Path:
    """An uninterrupted run of STEPS steps (RESUMED) with a checkpoint every 2 steps: the golden run."""
    return golden


def test_checkpoints_are_complete_and_pruned(reference):
    found = checkpoint.complete_checkpoints(reference)
    assert [p.name for p in found] == ["step-000004", "step-000006"]  # keep_last=2
    for path in found:
        checkpoint.validate(path)
        assert (path / "model" / "model.safetensors").is_file() and (path / "model" / "tokenizer.json").is_file()
    state = json.loads((found[-1] / "trainer_state.json").read_text())
    assert state["step"] == 6 and "rng" in state["task"]
    assert state["stage"] == "rl" and state["written_by"] == {"run_dir": str(reference), "command": "train"}
    assert not [p for p in (reference / "checkpoints").iterdir() if p.name.startswith(".")]  # no leftovers


def test_resume_after_sigkill_repeats_the_uninterrupted_run_exactly(reference, tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    proc = _start([*RESUMED, f"hydra.run.dir={run_dir}"], cache_dir)
    _wait_for_step(proc, run_dir, 3)  # the checkpoint of step 2 is written, step 3 logged
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = max(s["step"] for s in _steps(run_dir))
    assert killed_at < STEPS

    result = run_cli(["train", *RESUMED, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    # torch's warning that DCP assumes one process is kept off the console (docs/checkpoints.md)
    assert "torch.distributed is disabled" not in result.stdout + result.stderr
    resumed, expected = _steps(run_dir), _steps(reference)
    assert [s["step"] for s in resumed] == list(range(1, STEPS + 1))  # no step twice, none missing
    # the warmup (3 steps) is in effect, and the KL term too: the resume lands inside both
    assert [s["lr"] for s in expected[:4]] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
    assert all(s["kl"] > 0 for s in expected[1:])
    for got, want in zip(resumed, expected, strict=True):
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)
    # the final greedy evaluation and the final weights
    final_eval = {k: v for k, v in json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1]).items()
                  if k.startswith("eval/") and "time" not in k}
    assert final_eval and final_eval == pytest.approx(
        {k: v for k, v in json.loads((reference / "metrics.jsonl").read_text().splitlines()[-1]).items()
         if k in final_eval}, abs=1e-6)
    got, want = load_file(run_dir / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert got.keys() == want.keys()
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6
    assert any(not torch.equal(want[k], load_file(cache_dir / "models" / "tiny" / "model.safetensors")[k])
               for k in want)  # and they did train
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["resumed_from"].endswith("step-000002") or manifest["resumed_from"].endswith("step-000004")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path, cache_dir, signum):
    run_dir = tmp_path / "run"
    proc = _start([*RUN, "trainer.max_steps=500", f"hydra.run.dir={run_dir}"], cache_dir)
    _wait_for_step(proc, run_dir, 2)
    masks = [x for x in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if x.startswith("Sig")]
    os.killpg(proc.pid, signum)  # SIGINT to the group: what Ctrl-C in a terminal sends
    out, _ = proc.communicate(timeout=300)
    said = [x for x in out.splitlines() if signal.Signals(signum).name in x]
    assert proc.returncode == 128 + signum, (masks, said, out[-2000:])  # 143 / 130
    found = checkpoint.complete_checkpoints(run_dir)
    assert len(found) == 1
    checkpoint.validate(found[0])
    assert checkpoint.load_step(found[0]) == max(s["step"] for s in _steps(run_dir))
    assert "trainer.resume=" in out and f"hydra.run.dir={run_dir}" in out


def _wait_for_file(proc: subprocess.Popen, path: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path} not written in {timeout} s"
        time.sleep(0.1)


def test_a_second_ctrl_c_stops_at_once(tmp_path, cache_dir):
    """Mid-step, Ctrl-C asks for a stop after the step; a second one stops without finishing it. The
    step here cannot finish by itself (a reward sleeps for an hour), so only the second signal ends it."""
    run_dir, gate, started = tmp_path / "run", tmp_path / "gate", tmp_path / "started"
    proc = _start([*RUN, "trainer.max_steps=500", "reward.timeout_s=null",
                   "reward.terms.digits._target_=tests.slow_rewards.stall", f"+reward.terms.digits.kwargs.gate={gate}",
                   f"+reward.terms.digits.kwargs.started={started}", f"hydra.run.dir={run_dir}"],
                  cache_dir, extra_env={"PYTHONPATH": str(REPO)})
    try:
        _wait_for_step(proc, run_dir, 2)
        gate.touch()
        _wait_for_file(proc, started)  # a step is stuck in its reward
        os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while "finishing this step" not in (run_dir / "train.log").read_text():  # the first one was seen
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        stuck_at = max(s["step"] for s in _steps(run_dir)) + 1
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), out[-3000:]
    assert max(s["step"] for s in _steps(run_dir)) == stuck_at - 1  # the step in progress was dropped
    assert checkpoint.complete_checkpoints(run_dir) == []  # and no checkpoint written for it


def test_a_signal_during_the_first_evaluation_stops_before_the_first_step(tmp_path, cache_dir):
    """Ctrl-C while the first evaluation runs (its reward naps 4 s) stops the run when the evaluation
    ends, before any training step: on the default model a step takes minutes."""
    run_dir, gate, started = tmp_path / "run", tmp_path / "gate", tmp_path / "started"
    gate.touch()  # the first reward call of the run (in the first evaluation) naps
    proc = _start([*RUN, "trainer.max_steps=500", "reward.terms.digits._target_=tests.slow_rewards.stall",
                   f"+reward.terms.digits.kwargs.gate={gate}", f"+reward.terms.digits.kwargs.started={started}",
                   "+reward.terms.digits.kwargs.seconds=4", f"hydra.run.dir={run_dir}"],
                  cache_dir, extra_env={"PYTHONPATH": str(REPO)})
    try:
        _wait_for_file(proc, started)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "before step 1 started" in out
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0] and "eval/accuracy" in records[0]  # the evaluation, no step


def test_a_full_disk_keeps_the_previous_checkpoint_and_the_run_goes_on(tmp_path, cache_dir, tiny_path):
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    # Room for one checkpoint of the tiny model but not two: the second write hits a real ENOSPC.
    # (weights + 2 Adam moments + tokenizer is about 3x the model folder)
    size = sum(f.stat().st_size for f in tiny_path.rglob("*") if f.is_file()) * 4
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        result = run_cli(["train", *RUN, "trainer.max_steps=4", "trainer.save_every=2", "trainer.keep_last=1",
                          f"hydra.run.dir={run_dir}"], cache=cache_dir)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        assert "checkpoint of step 4 failed" in out and "step-000002, is intact" in out
        assert [p.name for p in checkpoint.complete_checkpoints(run_dir)] == ["step-000002"]
        checkpoint.validate(folder / "step-000002")
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # the partial write is gone
        assert [s["step"] for s in _steps(run_dir)] == [1, 2, 3, 4]
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_failed_checkpoint_write_keeps_the_previous_one_and_the_run_goes_on(reference, tmp_path, cache_dir,
                                                                             tiny_path):
    """The same promise as the full disk, for any user (no root, no mount): the resumed run may not
    write a file bigger than RLIMIT_FSIZE, which the checkpoint's weights and optimizer state exceed and
    nothing else it writes does, so the write of its next checkpoint fails for real (EFBIG), every time."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference / "checkpoints" / "step-000004", run_dir / "checkpoints" / "step-000004")
    limit = (tiny_path / "model.safetensors").stat().st_size * 3 // 4  # the run's curves.png is ~100 kB
    env = {**os.environ, "RLVR_CACHE": str(cache_dir), "HYDRA_FULL_ERROR": "0",
           # vLLM's CPU sampler compiles a kernel with g++, whose temporary files exceed the limit too
           "TORCH_COMPILE_DISABLE": "1"}
    result = subprocess.run([RLVR, "train", *pinned([*RESUMED, "logger=console", "trainer.save_model=false", "trainer.keep_last=1",
                                                     "trainer.resume=auto", f"hydra.run.dir={run_dir}"])], capture_output=True, text=True,
                            timeout=600, env=env,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    # (the optimizer's shard fails first: torch's writer reports EFBIG as "unexpected pos", not by name)
    assert "checkpoint of step 6 failed (writing the optimizer state failed" in out and "step-000004, is intact" in out
    assert [p.name for p in checkpoint.complete_checkpoints(run_dir)] == ["step-000004"]
    checkpoint.validate(run_dir / "checkpoints" / "step-000004")
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no partial write left
    assert [s["step"] for s in _steps(run_dir)] == list(range(1, STEPS + 1))
    assert (run_dir / "summary.json").is_file()  # the run finished


def test_nan_updates_are_skipped_then_the_run_stops_with_its_last_checkpoint(tmp_path, cache_dir):
    # A reward weight beyond float32's range on a term that always scores 0: every score is
    # inf * 0 = NaN, for real, and so is every advantage and the loss.
    run_dir = tmp_path / "run"
    result = run_cli(["train", *RUN, "reward=first_digit", "reward.terms.first_digit.kwargs.prefix=[QQQ]",
                      "reward.terms.first_digit.weight=1e39", "trainer.max_steps=10", "trainer.save_every=1",
                      "trainer.max_bad_steps=3", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the update was skipped 3 steps in a row" in out and "step-000002" in out
    assert [s["learn/skipped_updates"] for s in _steps(run_dir)] == [1.0, 1.0, 1.0]
    checkpoint.validate(run_dir / "checkpoints" / "step-000002")


@pytest.mark.parametrize("damage, message", [
    ("truncate_weights", "is corrupt"),
    ("drop_optimizer", "is incomplete: optimizer/.metadata missing"),
    ("garble_state", "is corrupt"),
])
def test_a_damaged_checkpoint_is_refused_at_start(reference, tmp_path, cache_dir, damage, message):
    broken = tmp_path / "step-000006"
    shutil.copytree(reference / "checkpoints" / "step-000006", broken)
    if damage == "truncate_weights":
        weights = broken / "model" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "drop_optimizer":
        shutil.rmtree(broken / "optimizer")
    else:
        (broken / "trainer_state.json").write_text('{"step": ')
    run_dir = tmp_path / "run"
    result = cli_here(["train", *RUN, f"trainer.resume={broken}", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode != 0
    assert f"checkpoint {broken} {message}" in result.stdout + result.stderr
    assert not (run_dir / "metrics.jsonl").exists()  # nothing started, nothing written


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_dir_with_another_run_is_refused_and_left_as_it_was(reference, tmp_path, cache_dir):
    """Refused from the command line before Hydra starts: Hydra would rewrite .hydra/ and append to
    train.log (and `rlvr plot` would then label the run with the refused command's overrides)."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    before = _snapshot(run_dir)
    result = cli_here(["train", *RUN, "optim.lr=0.5", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 1
    assert f"{run_dir} already holds a run" in result.stderr and "trainer.resume=auto" in result.stderr
    assert _snapshot(run_dir) == before  # byte for byte, and nothing added


def test_a_run_dir_named_in_a_way_the_command_line_cannot_see_is_refused_before_the_model_loads(
        reference, tmp_path, cache_dir, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    before = (run_dir / "metrics.jsonl").read_bytes()
    monkeypatch.setenv("OLD_RUN", str(run_dir))
    result = cli_here(["train", *RUN, "hydra.run.dir=${oc.env:OLD_RUN}"], cache=cache_dir)
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "already holds a run" in out
    assert "learner:" not in out  # refused before the learner was built (its first log line)
    assert (run_dir / "metrics.jsonl").read_bytes() == before and (run_dir / "checkpoints").is_dir()


def test_a_damaged_newest_checkpoint_is_named_and_auto_resume_falls_back_to_the_intact_one(reference, tmp_path,
                                                                                           cache_dir):
    """The largest file of the newest checkpoint cut short (a disk that filled, a copy cut short): given by
    path it is refused naming that file; under resume=auto the run continues from the older, intact
    checkpoint, says so, and repeats the uninterrupted run from there."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    newest = run_dir / "checkpoints" / "step-000006"
    largest = max((p for p in newest.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    name = str(largest.relative_to(newest))
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])

    refused = cli_here(["train", *RESUMED, f"trainer.resume={newest}", f"hydra.run.dir={tmp_path / 'other'}"],
                       cache=cache_dir)
    assert refused.returncode == 1
    assert f"checkpoint {newest} is corrupt: {name} holds" in refused.stdout + refused.stderr

    result = run_cli(["train", *RESUMED, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert f"{name} holds" in out and "resuming from" in out and "step-000004, the newest intact checkpoint" in out
    resumed, expected = _steps(run_dir), _steps(reference)
    assert [s["step"] for s in resumed] == list(range(1, STEPS + 1))
    for got, want in zip(resumed[4:], expected[4:], strict=True):  # steps 5 and 6, run again from step 4
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)


def _checkpoint_state(folder: Path, state: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"step": 3, **state}))
    return folder


@pytest.mark.parametrize("state, stage, said", [
    ({"stage": "sft", "task": {}, "written_by": {"run_dir": "/r", "command": "train"}}, "rl",
     "continue the whole recipe with the same command plus trainer.resume=auto hydra.run.dir=/r"),
    ({"stage": "sft", "task": {}, "written_by": {"run_dir": "/s", "command": "sft"}}, "rl",
     "or start RL from the model it wrote: model=local model.path=/s/model"),
    ({"stage": "rl", "task": {}, "written_by": {"run_dir": "/r", "command": "train"}}, "sft",
     "Continue that run with rlvr train and trainer.resume="),
    # written before checkpoints said their stage: a cold start's task state is the task's and a position
    ({"task": {"task": {"level": 0}, "position": 64}}, "rl", "is a checkpoint of a cold start, and this run is RL"),
    ({"task": {"rng": [1], "level": 0}}, "sft", "is a checkpoint of RL (rlvr train), and this run is a cold start"),
])
def test_a_checkpoint_of_another_stage_is_refused_naming_how_to_continue_it(tmp_path, state, stage, said):
    path = _checkpoint_state(tmp_path / "step-000003", state)
    with pytest.raises(rundir.RunDirError, match=re.escape(said)):
        rundir.refuse_other_stage(path, stage)
    rundir.refuse_other_stage(path, "sft" if stage == "rl" else "rl")  # its own stage resumes from it


def test_a_checkpoint_whose_state_does_not_parse_is_left_to_validate(tmp_path):
    path = tmp_path / "step-000003"
    path.mkdir()
    (path / "trainer_state.json").write_text('{"step": ')
    rundir.refuse_other_stage(path, "rl")  # (validate names what is wrong with it)
    with pytest.raises(checkpoint.CheckpointError, match="is incomplete"):
        checkpoint.find(str(path), tmp_path, "rl")
