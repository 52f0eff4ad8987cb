"""Shared fixtures: a private cache with the tiny model, Hydra composition, and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlvr.cli import CONFIG_DIR
from rlvr.config import register
from rlvr.models import build_atomically
from rlvr.models.tiny import build as build_tiny

RLVR = str(Path(sys.executable).with_name("rlvr"))
REPO = Path(__file__).resolve().parent.parent
# vLLM's compile cache outlives a test session (a cold engine start costs ~15 s more); the models do not.
os.environ.setdefault("VLLM_CACHE_ROOT", str(REPO / ".cache" / "vllm"))
# The suite computes in float32 on every CPU kind, so that what passes on one machine passes on another
# (trainer.precision's default, auto, picks bf16-mixed on CPUs with bf16 units); tests of bf16 say so.
FP32 = "trainer.precision=fp32"
# The tests of the loop were written against GRPO's step (one sampling round); `+experiment=multiplication`
# runs DAPO, whose dynamic sampling draws more rounds: the suite pins GRPO, and tests of DAPO set it.
GRPO = "algorithm=grpo"


def pinned(overrides: list[str]) -> list[str]:
    """`overrides` plus trainer.precision=fp32 and algorithm=grpo, unless they set these themselves."""
    extra = [] if any("trainer.precision=" in o for o in overrides) else [FP32]
    if not any(o.startswith(("algorithm=", "+algorithm=")) for o in overrides):
        extra.append(GRPO)
    return [*overrides, *extra]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """A cache folder of the test session, holding the tiny model (built here, nothing downloaded)."""
    cache = tmp_path_factory.mktemp("cache")
    build_atomically(cache / "models" / "tiny", build_tiny)
    return cache


@pytest.fixture(scope="session")
def tiny_path(cache_dir) -> Path:
    return cache_dir / "models" / "tiny"


def compose_config(overrides: list[str], cache: Path | None = None) -> DictConfig:
    """The config `rlvr train <overrides>` would run with."""
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        extra = [f"cache_dir={cache}"] if cache is not None else []
        return compose(config_name="train", overrides=[*pinned(overrides), *extra])


def tiny_learner(cache: Path, tiny_path: Path, overrides: list[str] | None = None):
    """(config, a learner of the tiny model on CPU) for the engine tests: lr 1e-2, sampling at 0.7,
    16 new tokens, plus `overrides`."""
    from rlvr.learner import Learner

    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.temperature=0.7", "rollout.max_tokens=16",
                          *(overrides or [])], cache)
    return cfg, Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.trainer, cfg.rollout.temperature,
                        cfg.rollout.max_tokens, "cpu")


def run_cli(args: list[str], cache: Path, timeout: int = 600, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed `rlvr` command as a user would (`train` and `eval` in float32 unless `args` set
    the precision); output captured as text."""
    if args and args[0] in ("train", "eval"):
        args = [args[0], *pinned(args[1:])]
    env = {**os.environ, "RLVR_CACHE": str(cache), "HYDRA_FULL_ERROR": "0", **(extra_env or {})}
    return subprocess.run([RLVR, *args], capture_output=True, text=True, timeout=timeout, env=env)
