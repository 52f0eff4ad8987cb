"""Unknown config keys, however they got in.

Hydra rejects `optim.lrr=1e-5` (the schema has no `lrr`), but its error message suggests
`+optim.lrr=1e-5`, and a `+` override adds a key even to a typed node: the run would go on with a
dead key in its config.yaml. `unknown_keys` walks the composed config and fails on any key that a
node's schema (a dataclass of rlvr/config.py) does not declare.

Untyped nodes are not checked here: a user's task without a schema (its constructor rejects what it
does not take) and the `kwargs` of reward terms (the reward function's own keywords). Reward terms
themselves are untyped in the schema but checked against RewardTerm.
"""

from __future__ import annotations

import dataclasses
import difflib
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlvr.config import ConfigError, RewardTerm

# reward.terms.NAME: untyped in the schema (so that `+` can add a term), held to RewardTerm's keys here.
_TERM = re.compile(r"reward\.terms\.[^.]+")


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
