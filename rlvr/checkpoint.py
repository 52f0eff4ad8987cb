"""Checkpoints: everything a run needs to continue exactly where it stopped.

    <run dir>/checkpoints/step-000040/
        model/               the policy: a Hugging Face folder (safetensors + tokenizer); with LoRA, merged
        adapter/             with LoRA (model.lora.r > 0): the adapter the learner resumes from (peft's folder)
        optimizer/           AdamW's state (torch.distributed.checkpoint: each rank writes its shards; any
                             number of ranks loads it)
        trainer.pt           LR-scheduler state, torch RNG state (loaded with weights_only=True)
        trainer_state.json   step, task state (sampler position, curriculum), Python/NumPy RNG states,
                             the rewards' state (failed calls so far); the stage that wrote it (rl or
                             sft) and the run dir and command of the run it belongs to
        metrics.jsonl        the metrics up to this step (put back into the run dir on resume)
        files.json           the size and SHA-256 of every other file, as written (written last)

A checkpoint is written into a temporary folder and renamed into place, so a folder named
`step-*` is always complete; older ones are pruned (`keep_last`) only after a new one is. A file
damaged afterwards (a disk that filled, a copy cut short) no longer matches files.json: resuming from
that checkpoint is refused naming the file, and `trainer.resume=auto` falls back to the newest intact
checkpoint, with a warning that says which and why.
Weights are safetensors, the trainer state JSON, trainer.pt goes through torch's weights-only loader;
but torch.distributed.checkpoint's `optimizer/.metadata` is a pickle: resume only checkpoints you trust.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.errors import RlvrError
from rlvr.rundir import CHECKPOINT_PREFIX, complete_checkpoints, refuse_other_stage

log = logging.getLogger("rlvr")

FILES = ("model/config.json", "optimizer/.metadata", "trainer.pt", "trainer_state.json", "metrics.jsonl")
# Written last into a checkpoint: the size and SHA-256 of every other file, as written.
RECORD = "files.json"


class CheckpointError(RlvrError, RuntimeError):
    """A checkpoint that cannot be used; the message names the folder and what is wrong."""


def find(resume: str | None, run_dir: Path, stage: str = "rl") -> Path | None:
    """The checkpoint `trainer.resume` asks for: None (start fresh), "auto" (the newest in the run
    dir, or None when there is none) or a path. A path that is not a usable checkpoint, or one that
    another stage wrote (a cold start's, for an RL run of `stage` "rl"), raises."""
    if resume is None:
        return None
    found = _find(resume, run_dir)
    if found is not None:
        refuse_other_stage(found, stage)
    return found


def _find(resume: str, run_dir: Path) -> Path | None:
    if resume == "auto":
        found = complete_checkpoints(run_dir)
        damaged = []
        for path in reversed(found):  # the newest intact one
            try:
                validate(path)
            except CheckpointError as e:
                log.warning("trainer.resume=auto: %s", e)
                damaged.append(path.name)
                continue
            if damaged:
                log.warning("trainer.resume=auto: resuming from %s, the newest intact checkpoint (%s damaged: see above)",
                            path, ", ".join(damaged))
            return path
        if found:
            raise CheckpointError(f"trainer.resume=auto: every checkpoint in {run_dir / 'checkpoints'} is damaged "
                                  "(see the warnings above); start over with trainer.overwrite=true")
        return None
    return validate(Path(resume).expanduser())


def validate(path: Path) -> Path:
    """Check that `path` holds a whole checkpoint whose files parse; raise CheckpointError if not."""
    if not path.is_dir():
        raise CheckpointError(f"trainer.resume: {path} is not a checkpoint folder (expected "
                              f"<run dir>/checkpoints/{CHECKPOINT_PREFIX}NNNNNN)")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: {', '.join(missing)} missing")
    _check_record(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text())
        int(state["step"])
        torch.load(path / "trainer.pt", weights_only=True, map_location="cpu")
        from torch.distributed.checkpoint import FileSystemReader

        FileSystemReader(path / "optimizer").read_metadata()
        from safetensors import safe_open

        for weights in (path / "model").glob("*.safetensors"):
            with safe_open(str(weights), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)  # reads the header and offsets of every tensor
    except Exception as e:  # any parse failure means the same to the user: this checkpoint is unusable
        raise CheckpointError(f"checkpoint {path} is corrupt: {type(e).__name__}: {e}") from e
    return path


def _digest(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**22):
            sha.update(chunk)
    return {"size": path.stat().st_size, "sha256": sha.hexdigest()}


def _record(folder: Path) -> None:
    """Write RECORD: what a complete checkpoint holds, file by file, as it was written."""
    files = {str(p.relative_to(folder)): _digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / RECORD).write_text(json.dumps(files, indent=1) + "\n")


def _check_record(path: Path) -> None:
    """Every file RECORD lists is there with the size and checksum it was written with; raise
    CheckpointError naming the first that is not. (Checkpoints written before RECORD existed pass.)"""
    if not (path / RECORD).is_file():
        return
    try:
        recorded = json.loads((path / RECORD).read_text())
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: its {RECORD} does not parse ({e})") from e
    for name, want in recorded.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} missing")
        size = file.stat().st_size
        if size != want["size"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} holds {size} bytes, {want['size']} were "
                                  "written (a disk that filled, a copy cut short?)")
        if _digest(file)["sha256"] != want["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} differs from what was written (its SHA-256 "
                                  "does not match)")


def adapter(path: Path, lora: bool) -> Path | None:
    """The checkpoint's LoRA adapter folder when the run trains with LoRA (`lora`), else None; a
    checkpoint and a run that disagree about LoRA raise."""
    folder = path / "adapter"
    if lora and not (folder / "adapter_config.json").is_file():
        raise CheckpointError(f"checkpoint {path} holds no LoRA adapter (adapter/), but model.lora.r > 0: it was "
                              "written by a run without LoRA; resume it with model.lora.r=0")
    if not lora and folder.exists():
        raise CheckpointError(f"checkpoint {path} was written by a LoRA run (it holds adapter/): resume it with the "
                              "same model.lora settings")
    return folder if lora else None


def load_step(path: Path) -> int:
    """The step a checkpoint was taken after."""
    return int(json.loads((path / "trainer_state.json").read_text())["step"])


def save(run_dir: Path, step: int, learner, task, rewards, keep_last: int, written_by: dict | None = None) -> Path:
    """Write the checkpoint of `step` atomically, then prune to the newest `keep_last` (0: keep all).
    `written_by`: the stage ("rl" or "sft") and the run it belongs to ({"stage", "run_dir", "command"}),
    which a run of another stage refuses to resume from (rlvr.rundir.refuse_other_stage).

    On failure (a full disk, say) the temporary folder is removed, the previous checkpoints stay
    as they were, and the error is raised for the caller to report. Across processes every rank calls
    this: each writes its optimizer shards, the whole weights are gathered, then rank 0 writes the rest.
    """
    from rlvr import distributed

    folder = run_dir / "checkpoints"
    final = folder / f"{CHECKPOINT_PREFIX}{step:06d}"
    tmp = Path(distributed.on_rank0(_temporary, folder, final.name))  # one folder, named by rank 0
    try:
        learner.save_optimizer(tmp / "optimizer")  # DCP: a failure on one rank raises on every rank
        weights = learner.policy.export_weights()
    except BaseException:
        if distributed.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return distributed.on_rank0(_write, tmp, final, run_dir, step, learner, weights, task, rewards, keep_last,
                                written_by or {})


def save_or_report(run_dir: Path, step: int, learner, task, rewards, keep_last: int,
                   written_by: dict | None = None) -> Path | None:
    """`save`, for the loop: a failed write (a full disk: OSError, SafetensorError or RuntimeError) is
    logged, naming the previous checkpoint, which is intact, and the run goes on (None). A collective's
    timeout is raised, not reported: a rank that never came must end the run (rlvr.launch), not make it
    try again at the next collective."""
    from rlvr import distributed

    try:
        path = save(run_dir, step, learner, task, rewards, keep_last, written_by)
    except Exception as e:
        if distributed.timed_out(e):
            raise
        previous = complete_checkpoints(run_dir)
        log.error("checkpoint of step %d failed (%s); %s", step, e,
                  f"the previous one, {previous[-1]}, is intact" if previous else "there is no earlier one")
        return None
    log.info("checkpoint: %s", path)
    return path


def _temporary(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.", dir=folder)


def _write(tmp: Path, final: Path, run_dir: Path, step: int, learner, weights, task, rewards, keep_last: int,
           written_by: dict) -> Path:
    try:
        learner.policy.save(tmp / "model", weights)
        if learner.policy.lora:
            learner.policy.save_adapter(tmp / "adapter")
        torch.save({**learner.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / "trainer.pt")
        np_state = np.random.get_state()
        state: dict[str, Any] = {
            "step": step,
            "task": task.state_dict(),
            "python_rng": _jsonable(random.getstate()),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "rewards": rewards.state_dict(),
            "stage": written_by.get("stage", "rl"),
            "written_by": {k: v for k, v in written_by.items() if k != "stage"},
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        shutil.copyfile(run_dir / "metrics.jsonl", tmp / "metrics.jsonl")
        _record(tmp)
        os.chmod(tmp, 0o755)
        if final.exists():  # a checkpoint of this step from an earlier attempt
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last > 0:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(path: Path, learner, task, rewards) -> int:
    """Restore optimizer, scheduler, RNGs, task and reward counters from a validated checkpoint;
    return its step. (The policy weights are loaded by building the learner from `path / "model"`.)"""
    try:
        learner.load_optimizer(path / "optimizer")
    except Exception as e:  # DCP wraps what went wrong (a missing key, a shape) in its own exception
        raise CheckpointError(f"checkpoint {path}: its optimizer state does not fit this model ({type(e).__name__}: "
                              f"{e}); it was written by another model, LoRA setting or rlvr version") from e
    blob = torch.load(path / "trainer.pt", weights_only=True, map_location="cpu")
    learner.load_state_dict(blob)
    torch.set_rng_state(blob["torch_rng"])
    state = json.loads((path / "trainer_state.json").read_text())
    task.load_state_dict(state["task"])
    random.setstate(_tuples(state["python_rng"]))
    kind, keys, *rest = state["numpy_rng"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    # (checkpoints of rlvr before the rewards' state_dict kept the error count as reward_errors)
    rewards.load_state_dict(state["rewards"] if "rewards" in state else {"errors": state["reward_errors"]})
    return int(state["step"])


def _jsonable(value):
    return [_jsonable(v) for v in value] if isinstance(value, tuple | list) else value


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
