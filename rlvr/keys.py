"""Unknown config keys, however they got in.

Hydra rejects `optim.lrr=1e-5` (the schema has no `lrr`), but its error message suggests
`+optim.lrr=1e-5`, and a `+` override adds a key even to a typed node: the run would go on with a
dead key in its config.yaml. `unknown_keys` walks the composed config and fails on any key that a
node's schema (a dataclass of rlvr/config.py or rlvr/config_data.py) does not declare.

Untyped nodes are not checked here: a user's task without a schema (its constructor rejects what it
does not take) and the `kwargs` of reward terms (the reward function's own keywords). Reward terms
themselves are untyped in the schema but checked against RewardTerm.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlvr.choices import Choice
from rlvr.config import RENAMED, TrainConfig
from rlvr.config_data import RewardTerm
from rlvr.errors import ConfigError

# reward.terms.NAME (and a mixture source's): untyped in the schema (so that `+` can add a term), held to RewardTerm's keys here.
_TERM = re.compile(r"(data\.sources\.[^.]+\.)?reward\.terms\.[^.]+")


def unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first key (by its dotted path) that its node's schema lacks."""
    _walk(cfg, "")


def _walk(node: DictConfig | ListConfig, path: str) -> None:
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            child = node._get_node(i)
            if isinstance(child, DictConfig | ListConfig):
                _walk(child, f"{path}[{i}]")
        return
    if node._is_missing() or node._is_none() or node._is_interpolation():
        return
    schema = RewardTerm if _TERM.fullmatch(path) else OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        where = f"{path}.{key}" if path else str(key)
        if fields is not None and key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {(path + '.' if path else '') + close[0]}?" if close else ""
            raise ConfigError(f"{where}: no such key; {path or 'the config'} ({schema.__name__}) takes "
                              f"{', '.join(fields)}{hint}")
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig):
            _walk(child, where)


def check_overrides(args: list[str], config_dir: Path, user_dirs: list[Path]) -> None:
    """Reject, before Hydra composes anything, a command-line override that names a key the schema
    does not have (with the closest one), a key that was renamed (with its new name), a group option
    that does not exist (with the options there are), or a value outside a key's choices. Hydra
    would also reject most of these, but with advice that does not help (`+key=...` adds a dead key)
    and internal schema names among the choices. Keys under `data`, `reward.terms`, `tools` and
    `hydra` are left to the later checks (their schema depends on the option chosen)."""
    dirs = [config_dir, *user_dirs]
    groups = {p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.is_dir()}
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        adds = key.startswith(("+", "~"))
        key = key.lstrip("+~")
        if key in RENAMED:
            raise ConfigError(f"{key}: renamed to {RENAMED[key]} (trainer is the loop; learner says how the policy "
                              f"computes, launch where the run runs): use {RENAMED[key]}={value}")
        if "/" in key or "@" in key or key.split(".")[0] == "hydra" or "(" in value:
            continue  # (Hydra's own keys and packages; a sweep function such as choice(...) or range(...))
        if "." not in key and key in groups:
            _check_option(key, value, dirs)
        elif not adds:
            _check_key(key, value)


def group_options(group: str, dirs: list[Path]) -> list[str]:
    """The options of config group `group` in the config folders `dirs`: its YAML files, less the ones
    whose name starts with _ (files other options include, not options of their own)."""
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml") if not p.stem.startswith("_")})


def _check_option(group: str, value: str, dirs: list[Path]) -> None:
    if value.startswith(("[", "$")) or value in ("null", ""):
        return
    options = group_options(group, dirs)
    for choice in value.split(","):  # a multirun sweeps several
        if choice not in options:
            close = difflib.get_close_matches(choice, options, n=1)
            raise ConfigError(f"{group}={choice}: no such option; {group} is one of {', '.join(options)}"
                              + (f"; did you mean {group}={close[0]}?" if close else ""))


def _check_key(key: str, value: str) -> None:
    schema: Any = TrainConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(schema)}
        where = ".".join(parts[: i + 1])
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f"; did you mean {'.'.join([*parts[:i], close[0]])}?" if close else ""
            raise ConfigError(f"{where}: no such key; {'.'.join(parts[:i]) or 'the config'} takes "
                              f"{', '.join(fields)}{hint}")
        kind = _resolved_type(schema, part)
        if dataclasses.is_dataclass(kind):
            schema = kind
            continue
        if i < len(parts) - 1:  # an untyped node (data, reward.terms, tools): checked later
            return
        if isinstance(kind, type) and issubclass(kind, Choice) and not value.startswith("$"):
            words = [c.value for c in kind]
            for choice in value.split(","):
                if choice not in words:
                    extra = (" (fp16 is refused: CPUs have no fast fp16 matmul and fp16 training needs loss "
                             "scaling, which rlvr does not do; use bf16-mixed or auto)"
                             if key == "learner.precision" and "16" in choice and "bf16" not in choice else "")
                    raise ConfigError(f"{key}: must be one of {', '.join(words)}, got {choice!r}{extra}")


def _resolved_type(schema: Any, name: str) -> Any:
    """The type of field `name` of dataclass `schema` (annotations are strings under `from __future__
    import annotations`)."""
    return typing.get_type_hints(schema)[name]
