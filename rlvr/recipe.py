"""A recipe: the stages `rlvr train` runs in order (`recipe: [sft, dpo, rl]`, or one of them), each a
run of its own (`rlvr.run.build`) with its data source and objective, all into one run dir:

    <run dir>/sft/     the cold start (rlvr.sft), when listed before the last stage
    <run dir>/dpo/     preference tuning (rlvr.preference), likewise
    <run dir>/         the last stage (a one-stage recipe is a plain run)

Each stage starts from the model the one before it wrote (<run dir>/<stage>/model), which is also its
reference (DPO's, or a KL term's). After a kill the same command plus `trainer.resume=auto` finds the
stages that are done, continues the one that was running from its last checkpoint, and runs the rest.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from rlvr.config import STAGES, TrainConfig
from rlvr.rundir import refuse_other_stage

log = logging.getLogger("rlvr")


def stage_runner(name: str):
    """The function that runs the stage `name`: (cfg, run_dir, recipe_dir) -> its last record."""
    if name == "sft":
        from rlvr.sft import run_sft

        return run_sft
    if name == "dpo":
        from rlvr.preference import run_dpo

        return run_dpo
    from rlvr.train import run_rl

    return run_rl


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, float]:
    """`rlvr train`: the recipe's stages in order into `run_dir` (module docstring); the last stage's
    record. Across processes every rank runs this whole function; rank 0 alone writes."""
    cfg.check()
    cfg.check_recipe()
    *before, last = cfg.recipe
    if before and cfg.trainer.resume not in (None, "auto"):  # the last stage's checkpoint: refused now if not
        refuse_other_stage(Path(cfg.trainer.resume).expanduser(), last)
    for name in before:
        cfg = _earlier_stage(cfg, name, run_dir / name, run_dir)
    return stage_runner(last)(cfg, run_dir, run_dir if before else None)


def _earlier_stage(cfg: TrainConfig, name: str, stage_dir: Path, recipe_dir: Path) -> TrainConfig:
    """Run the stage `name` into `stage_dir`, or with trainer.resume set, continue it or find it done;
    return the config of the next stage, which starts from its model."""
    model = stage_dir / "model"
    done = (stage_dir / "summary.json").is_file() and (model / "config.json").is_file()
    resume = None if cfg.trainer.resume is None else "auto"  # an explicit checkpoint is the last stage's
    # (every stage before the last writes its model: the next one starts from it)
    stage = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume=resume, save_model=True))
    if done and resume == "auto" and not cfg.trainer.overwrite:
        log.info("%s: done already, in %s; the next stage starts from %s", STAGES[name], stage_dir, model)
    else:
        log.info("%s: %d steps into %s, then the next stage from its model", STAGES[name], cfg.schedule(name).steps,
                 stage_dir)
        stage_runner(name)(stage, stage_dir, recipe_dir)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model), build=None))
