"""Shared fixtures: a private cache with the tiny model, Hydra composition, and the CLI."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlvr.cli import CONFIG_DIR
from rlvr.config import TrainConfig, register, typed
from rlvr.config_data import RewardConfig, reward_terms
from rlvr.models import build_atomically
from rlvr.models.tiny import build as build_tiny

RLVR = str(Path(sys.executable).with_name("rlvr"))
REPO = Path(__file__).resolve().parent.parent
# vLLM's compile cache outlives a test session (a cold engine start costs ~15 s more); the models do not.
os.environ.setdefault("VLLM_CACHE_ROOT", str(REPO / ".cache" / "vllm"))
# The suite computes in float32 on every CPU kind, so that what passes on one machine passes on another
# (learner.precision's default, auto, picks bf16-mixed on CPUs with bf16 units); tests of bf16 say so.
FP32 = "learner.precision=fp32"
# The tests of the loop were written against GRPO's step (one sampling round); `+experiment=multiplication`
# runs DAPO, whose dynamic sampling draws more rounds: the suite pins GRPO, and tests of DAPO set it.
GRPO = "algorithm=grpo"


# `make test` runs two workers (pytest-xdist), each taking whole files in this order (the Makefile's
# --no-loadscope-reorder): the longest go first, so that no worker is left with a long file while the
# other has finished.
LONGEST_FIRST = ["test_distributed.py", "test_checkpoint.py", "test_shared_prefix.py", "test_learning.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # (stable: the rest keep their order)


def pinned(overrides: list[str]) -> list[str]:
    """`overrides` plus learner.precision=fp32 and algorithm=grpo, unless they set these themselves."""
    extra = [] if any("learner.precision=" in o for o in overrides) else [FP32]
    if not any(o.startswith(("algorithm=", "+algorithm=")) for o in overrides):
        extra.append(GRPO)
    return [*overrides, *extra]


def pinned_command(args: list[str]) -> list[str]:
    """An `rlvr` command line with `train`, `sft` and `eval` pinned (`pinned`); other commands as they are."""
    return [args[0], *pinned(args[1:])] if args and args[0] in ("train", "sft", "eval") else args


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """A cache folder of the test session, holding the tiny model (built here, nothing downloaded)."""
    cache = tmp_path_factory.mktemp("cache")
    build_atomically(cache / "models" / "tiny", build_tiny)
    return cache


@pytest.fixture(scope="session")
def tiny_path(cache_dir) -> Path:
    return cache_dir / "models" / "tiny"


def compose_dictconfig(overrides: list[str], cache: Path | None = None) -> DictConfig:
    """The config Hydra composes for `rlvr train <overrides>`, before it is typed."""
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        extra = [f"cache_dir={cache}"] if cache is not None else []
        return compose(config_name="train", overrides=[*pinned(overrides), *extra])


def compose_config(overrides: list[str], cache: Path | None = None) -> TrainConfig:
    """The typed config `rlvr train <overrides>` would run with."""
    return typed(compose_dictconfig(overrides, cache))


# The golden run: one training run on the tiny model, made once per test session, whose outputs the
# tests of metrics, samples, the manifest, wandb, plots, `rlvr eval`, checkpoints and exact resume all
# read. A KL term to the original model and a warmup that a resume lands in the middle of, both of
# which a resume must carry over; a checkpoint every 2 steps (the newest 2 kept); the final model.
GOLDEN = ["+experiment=multiplication", "model=tiny", "reward=digits", "optim.lr=1e-3", "data.batch_size=2",
          "algorithm.group_size=4", "rollout.max_tokens=16", "data.eval_size=4", "algorithm.kl.coef=0.05",
          "optim.warmup_steps=3", "trainer.max_steps=6", "trainer.save_every=2", "trainer.samples_every=1",
          "logger=wandb", "logger.mode=offline"]


@pytest.fixture(scope="session")
def golden(tmp_path_factory, cache_dir) -> Path:
    """The run dir of the golden run (GOLDEN), uninterrupted; its console output lies beside it
    (console.txt). Tests read them and never write into them."""
    run_dir = tmp_path_factory.mktemp("golden") / "run"
    result = run_cli(["train", *GOLDEN, f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir.parent / "console.txt").write_text(result.stdout + result.stderr)  # what the user saw
    return run_dir


@functools.cache
def _default_reward() -> RewardConfig:
    return compose_config(["model=tiny"]).reward


def reward_config(terms: dict, **settings) -> RewardConfig:
    """The reward group's defaults (configs/reward/_base.yaml) with these `terms` (name -> {_target_,
    weight, kwargs}; the first is the correct term unless `settings` say) and `settings`."""
    settings.setdefault("correct_term", next(iter(terms)))
    return dataclasses.replace(_default_reward(), terms=reward_terms(terms), **settings)


def tiny_learner(cache: Path, tiny_path: Path, overrides: list[str] | None = None):
    """(config, a learner of the tiny model on CPU) for the engine tests: lr 1e-2, sampling at 0.7,
    16 new tokens, plus `overrides`."""
    from rlvr.learner import Learner

    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.temperature=0.7", "rollout.max_tokens=16",
                          *(overrides or [])], cache)
    return cfg, Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                        cfg.rollout.max_tokens, "cpu")


def run_cli(args: list[str], cache: Path, timeout: int = 600, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed `rlvr` command as a user would (`train`, `sft` and `eval` in float32 unless `args` set
    the precision); output captured as text."""
    args = pinned_command(args)
    env = {**os.environ, "RLVR_CACHE": str(cache), "HYDRA_FULL_ERROR": "0", **(extra_env or {})}
    return subprocess.run([RLVR, *args], capture_output=True, text=True, timeout=timeout, env=env)


def cli_here(args: list[str], cache: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`rlvr <args>` as `run_cli` runs it, but in this process: for the checks that stop a run at start,
    which a second interpreter would spend most of its time importing torch and vLLM for. Output goes to
    the returned stdout/stderr; the environment, the working directory, sys.argv and the logging
    handlers are put back afterwards."""
    import contextlib
    import io
    import logging

    from rlvr import cli

    args = pinned_command(args)
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env, saved_cwd = sys.argv, dict(os.environ), Path.cwd()
    saved_handlers, saved_level = logging.root.handlers[:], logging.root.level
    os.environ.update(RLVR_CACHE=str(cache), HYDRA_FULL_ERROR="0")
    sys.argv = ["rlvr", *args]
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        for handler in logging.root.handlers[:]:
            if handler not in saved_handlers:
                handler.close()
                logging.root.removeHandler(handler)
        logging.root.setLevel(saved_level)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

