"""The run directory's rules and the signals that stop a run.

- A run dir holds one run: a new run refuses a dir that holds another (`prepare`), unless told to
  continue it (trainer.resume) or to start over (trainer.overwrite); a run refused at start-up
  leaves no empty dir behind (`remove_if_untouched`).
- SIGINT / SIGTERM ask the loop to stop after its step and write a checkpoint (`GracefulStop`).
- A checkpoint says which stage wrote it (RL or a cold start) and the run dir of the command that did
  (`written_by`); a run of one stage refuses another's checkpoint in one line (`refuse_other_stage`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path

from rlvr.errors import RlvrError

log = logging.getLogger("rlvr")


class RunDirError(RlvrError, RuntimeError):
    """The run dir cannot take this run; the message says what to do instead."""


class GracefulStop:
    """Once installed, SIGINT / SIGTERM ask the loop to stop after the current step (a second
    signal stops at once); `restore` puts the previous handlers back."""

    MESSAGE = "%s: finishing this step, then writing a checkpoint (send it again to stop at once)"

    def __init__(self) -> None:
        self.signal: int | None = None
        watched = (signal.SIGINT, signal.SIGTERM)
        self.previous = {s: signal.signal(s, self._handle) for s in watched}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)  # a mask inherited from the parent would hold them back

    def _handle(self, signum: int, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        log.warning(self.MESSAGE, signal.Signals(signum).name)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def refuse(run_dir: Path, resume: Path | None, overwrite: bool, auto_resume: bool = False) -> None:
    """Refuse a run dir that holds another run, unless resuming or told to overwrite. `auto_resume`: the
    user asked for trainer.resume=auto (and the run dir holds no checkpoint, or `resume` would be set)."""
    if resume is None and not overwrite and (run_dir / "metrics.jsonl").exists():
        raise RunDirError(_held(run_dir, auto_resume))


def prepare(run_dir: Path, resume: Path | None, overwrite: bool, auto_resume: bool = False) -> None:
    """Make `run_dir` ready for this run (after `refuse`, which it repeats): on resume, put back the
    metrics of the checkpoint (steps after it will be run again); with overwrite, remove the old
    run's outputs and checkpoints."""
    refuse(run_dir, resume, overwrite, auto_resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    if resume is not None:
        tmp = metrics.with_suffix(".jsonl.tmp")
        shutil.copyfile(resume / "metrics.jsonl", tmp)
        os.replace(tmp, metrics)
    elif metrics.exists():
        for name in ("metrics.jsonl", "samples.jsonl", "summary.json", "curves.png"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # resume=auto must not find the old run's


def _held(run_dir: Path, auto_resume: bool) -> str:
    if auto_resume:
        return (f"trainer.resume=auto: {run_dir} holds a run (metrics.jsonl) but no complete checkpoint to resume "
                "from (checkpoints are written every trainer.save_every steps; 0 writes none). Start over with "
                "trainer.overwrite=true, or choose another hydra.run.dir.")
    return (f"{run_dir} already holds a run (metrics.jsonl). Continue it with trainer.resume=auto, start over with "
            "trainer.overwrite=true, or choose another hydra.run.dir.")


def refuse_early(args: list[str], stage: str = "rl") -> None:
    """`prepare`'s refusal, and `refuse_other_stage`'s, from the command line alone, before Hydra starts:
    Hydra writes its .hydra/ files and appends to train.log in the run dir as the job starts, so a run
    refused only then would already have changed the run it refuses to overwrite. `stage`: what the
    command continues from a checkpoint (`rlvr train`, the recipe included: RL's; `rlvr sft`: a cold
    start's). (A run dir, resume or overwrite set in a YAML file instead is still refused, by `prepare`
    and rlvr.checkpoint.find, after Hydra started but before the run writes.)"""
    if {"-m", "--multirun"} & set(args):
        return
    values = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    resume = values.get("trainer.resume", "null")
    if resume not in ("null", "auto") and "${" not in resume:
        refuse_other_stage(Path(resume).expanduser(), stage)
    run_dir = values.get("hydra.run.dir")
    if run_dir is None or "${" in run_dir or values.get("trainer.overwrite", "false").lower() == "true":
        return
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists() or resume not in ("null", "auto"):
        return
    found = complete_checkpoints(run_dir)
    if resume == "null" or not found:
        raise RunDirError(_held(run_dir, resume == "auto"))
    refuse_other_stage(found[-1], stage)


CHECKPOINT_PREFIX = "step-"
STAGES = {"rl": "RL (rlvr train)", "sft": "a cold start", "dpo": "a preference stage"}


def written_by(checkpoint: Path) -> tuple[str | None, dict]:
    """(the stage that wrote `checkpoint`: "rl" or "sft", what its trainer_state.json says of the run
    that wrote it: `run_dir`, `command`). A checkpoint from before stages were recorded is told by its
    task state (a cold start's holds the task's and a position); one that does not parse gives None
    (rlvr.checkpoint.validate names what is wrong with it)."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None, {}
    if not isinstance(state, dict):
        return None, {}
    stage = state.get("stage")
    if stage is None and isinstance(state.get("task"), dict):
        stage = "sft" if set(state["task"]) == {"task", "position"} else "rl"
    return stage, state.get("written_by") or {}


def refuse_other_stage(checkpoint: Path, stage: str) -> None:
    """Refuse to continue a run of `stage` from a checkpoint another stage wrote (a cold start's into
    RL, or RL's into a cold start), saying how to continue the run that wrote it."""
    written, by = written_by(checkpoint)
    if written is None or written == stage:
        return
    where, command = by.get("run_dir"), by.get("command")
    message = f"trainer.resume: {checkpoint} is a checkpoint of {STAGES[written]}, and this run is {STAGES[stage]}"
    if written == "sft" and command == "train":
        message += (f". It is the cold start of the recipe in {where}: continue the whole recipe with the same "
                    f"command plus trainer.resume=auto hydra.run.dir={where}")
    elif written == "sft" and where:
        message += (f". Continue that cold start with rlvr sft and trainer.resume={checkpoint} "
                    f"hydra.run.dir={where}, or start RL from the model it wrote: model=local "
                    f"model.path={Path(where) / 'model'}")
    elif where:
        message += f". Continue that run with rlvr train and trainer.resume={checkpoint} hydra.run.dir={where}"
    raise RunDirError(message)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of a run dir, oldest first (rlvr.checkpoint writes each into a temporary
    folder and renames it into place when complete; temporary folders are not listed)."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
             and p.name.removeprefix(CHECKPOINT_PREFIX).isdigit()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)))


HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}  # what Hydra writes into <run dir>/.hydra/


def remove_if_untouched(run_dir: Path) -> None:
    """Remove `run_dir` when it holds only what Hydra wrote at job start (`.hydra/`, the `*.log`
    file), then its parents left empty, up to the current directory. A dir holding anything else
    (a resumed run's metrics and checkpoints) is left as it is."""
    for handler in logging.root.handlers[:]:  # Hydra's file handler keeps the log file open
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
            handler.close()
            logging.root.removeHandler(handler)
    cwd = Path.cwd().resolve()
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or run_dir == cwd or run_dir in cwd.parents:
        return
    for entry in run_dir.iterdir():
        if entry.is_symlink():
            return
        if entry.is_file() and entry.suffix == ".log":
            continue
        if entry.name == ".hydra" and entry.is_dir() and all(
                f.is_file() and not f.is_symlink() and f.name in HYDRA_FILES for f in entry.iterdir()):
            continue
        return
    shutil.rmtree(run_dir)
    parent = run_dir.parent
    while cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
