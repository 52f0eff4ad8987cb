"""Where the policy's Hugging Face folder comes from: a local path, built on first use if configured."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hydra.utils import get_method

from rlvr import distributed
from rlvr.config import ModelConfig
from rlvr.errors import RlvrError

log = logging.getLogger(__name__)


class ModelError(RlvrError, ValueError):
    """A model folder that is missing or unusable; the message names the path and the fix."""


def resolve(cfg: ModelConfig, cache_dir: Path) -> Path:
    """The model folder of `cfg` (the `model` group), building it first when it is missing.

    Only folders inside `cache_dir` are built: a mistyped `model.path=outputs/…/model` must fail,
    not quietly become a fresh copy of the default model.
    """
    path = Path(cfg.path).expanduser()
    # Across processes rank 0 alone builds it (transformers writes a model's weights and config on
    # torch.distributed's rank 0 only: another rank's build would be a folder without them).
    distributed.on_rank0(_build_if_missing, cfg, path, cache_dir)
    if not path.exists():  # (rank 0 built it, but not where this rank can see it)
        raise ModelError(f"model.path={str(path)!r} does not exist on this machine; rank 0 built it on its own. "
                         "Put the cache dir (RLVR_CACHE) on a filesystem every node sees, or copy the folder there.")
    if not (path / "config.json").is_file():
        raise ModelError(f"model.path={str(path)!r} has no config.json: not a Hugging Face model folder.")
    return path


def describe(path: Path) -> str:
    """`model.path='…' (a <family> model, <architecture>)`, as errors about a model folder name it."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return f"model.path={str(path)!r}"
    return f"model.path={str(path)!r} (a {config.get('model_type')!r} model, {', '.join(config.get('architectures') or ['?'])})"


def check(path: Path) -> None:
    """Refuse, before anything loads, a folder that transformers cannot load as a causal LM or whose
    tokenizer has no chat template (every task's prompts are chat messages, rendered by it)."""
    from transformers import AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(f"{describe(path)} cannot be loaded as a causal LM: this transformers has none for "
                         f"model_type {model_type!r}.")
    if AutoTokenizer.from_pretrained(path).chat_template is None:
        raise ModelError(f"{describe(path)} has a tokenizer without a chat template; the task's prompts are chat "
                         "messages. Use an instruct/chat model, or add a chat_template (chat_template.jinja) to "
                         "the folder.")


def _build_if_missing(cfg: ModelConfig, path: Path, cache_dir: Path) -> None:
    if path.exists():
        return
    if cfg.build is None or not path.resolve().is_relative_to(Path(cache_dir).expanduser().resolve()):
        raise ModelError(f"model.path={str(path)!r} does not exist. Point model.path at a local "
                         "Hugging Face folder (config.json, weights, tokenizer).")
    log.info("building model folder %s with %s (once; cached afterwards)", path, cfg.build)
    build_atomically(path, get_method(cfg.build))


def build_atomically(path: Path, build: Callable[[Path], None], replace: bool = False) -> None:
    """Run `build(tmp)` into a temporary folder beside `path`, then rename it into place, so an
    interrupted build never leaves a folder that looks complete. An existing `path` is kept (another
    process built the same thing first) unless `replace`, when the new folder takes its place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    old = None
    try:
        build(tmp)
        if not (tmp / "config.json").is_file():  # never a folder that only looks like a model
            raise ModelError(f"building {path} wrote no config.json into {tmp}")
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
