"""Where the policy's Hugging Face folder comes from: a local path, built on first use if configured."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hydra.utils import get_method
from omegaconf import DictConfig

from rlvr.errors import RlvrError

log = logging.getLogger(__name__)


class ModelError(RlvrError, ValueError):
    """A model folder that is missing or unusable; the message names the path and the fix."""


def resolve(cfg: DictConfig, cache_dir: Path) -> Path:
    """The model folder of `cfg` (the `model` group), building it first when it is missing.

    Only folders inside `cache_dir` are built: a mistyped `model.path=outputs/…/model` must fail,
    not quietly become a fresh copy of the default model.
    """
    path = Path(cfg.path).expanduser()
    if not path.exists():
        if cfg.build is None or not path.resolve().is_relative_to(Path(cache_dir).expanduser().resolve()):
            raise ModelError(f"model.path={str(path)!r} does not exist. Point model.path at a local "
                             "Hugging Face folder (config.json, weights, tokenizer).")
        log.info("building model folder %s with %s (once; cached afterwards)", path, cfg.build)
        build_atomically(path, get_method(cfg.build))
    if not (path / "config.json").is_file():
        raise ModelError(f"model.path={str(path)!r} has no config.json: not a Hugging Face model folder.")
    return path


def build_atomically(path: Path, build: Callable[[Path], None], replace: bool = False) -> None:
    """Run `build(tmp)` into a temporary folder beside `path`, then rename it into place, so an
    interrupted build never leaves a folder that looks complete. An existing `path` is kept (another
    process built the same thing first) unless `replace`, when the new folder takes its place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    old = None
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp made it private
        if replace and path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except OSError:  # another process finished the same build first; theirs is as good
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
