"""The run directory's rules and the signals that stop a run.

- A run dir holds one run: a new run refuses a dir that holds another (`prepare`), unless told to
  continue it (trainer.resume) or to start over (trainer.overwrite); a run refused at start-up
  leaves no empty dir behind (`remove_if_untouched`).
- SIGINT / SIGTERM ask the loop to stop after its step and write a checkpoint (`GracefulStop`).
"""

from __future__ import annotations

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
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum
        log.warning(self.MESSAGE, signal.Signals(signum).name)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def prepare(run_dir: Path, resume: Path | None, overwrite: bool, auto_resume: bool = False) -> None:
    """Refuse a run dir that holds another run (unless resuming or told to overwrite); on resume,
    put back the metrics of the checkpoint (steps after it will be run again). `auto_resume`: the
    user asked for trainer.resume=auto and the run dir holds no checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    if resume is not None:
        tmp = metrics.with_suffix(".jsonl.tmp")
        shutil.copyfile(resume / "metrics.jsonl", tmp)
        os.replace(tmp, metrics)
    elif metrics.exists():
        if not overwrite and auto_resume:
            raise RunDirError(
                f"trainer.resume=auto: {run_dir} holds a run (metrics.jsonl) but no complete checkpoint to resume "
                "from (checkpoints are written every trainer.save_every steps; 0 writes none). Start over with "
                "trainer.overwrite=true, or choose another hydra.run.dir.")
        if not overwrite:
            raise RunDirError(
                f"{run_dir} already holds a run (metrics.jsonl). Continue it with trainer.resume=auto, "
                "start over with trainer.overwrite=true, or choose another hydra.run.dir.")
        for name in ("metrics.jsonl", "samples.jsonl", "summary.json", "curves.png"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # resume=auto must not find the old run's


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
