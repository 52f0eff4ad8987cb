"""The base of every error that is the user's to fix (a bad key, a missing file, a corrupt
checkpoint): the CLI prints its message alone, without a traceback, and exits with status 1."""


class RlvrError(Exception):
    """An error whose message says what was wrong, where, and what would fix it."""


class EngineError(RlvrError, RuntimeError):
    """The rollout engine failed on a request; the message names the request (and the step, in training)."""


class WeightSyncError(RlvrError, RuntimeError):
    """The rollout engine does not serve the learner's weights (a stale or corrupt sync)."""


class EngineConfigError(RlvrError, ValueError):
    """Engine settings that cannot work with this model or machine; the message names the key."""


class ConfigError(RlvrError, ValueError):
    """A config that composes but makes no sense; the message names the key."""


def need(ok: bool, key: str, why: str) -> None:
    """The check of one key: a ConfigError naming it, saying `why`, unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}: {why}")



def import_failure(target: str, error: BaseException) -> str:
    """Why the dotted path `target` (a `_target_`) did not import, in one line with the fix, from the
    error Hydra's `get_method`/`get_class` raised (its own message runs over three lines and ends in a
    question). The usual case: the user's package is neither installed nor on PYTHONPATH.

    >>> from hydra.utils import get_method
    >>> try:
    ...     get_method("json.dumpz")
    ... except Exception as e:
    ...     print(import_failure("json.dumpz", e))
    'json' has no function, class or module named 'dumpz'
    """
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    if isinstance(root, ModuleNotFoundError) and root.name and (
            target == root.name or target.startswith(root.name + ".")):
        if "." in root.name:  # its parent imported: the last name is wrong
            parent, name = root.name.rsplit(".", 1)
            return f"{parent!r} has no function, class or module named {name!r}"
        return (f"no module named {root.name!r} here. Install the package that holds it (pip install -e <its "
                f"folder>), or run rlvr with PYTHONPATH set to the folder that holds {root.name}/ (PYTHONPATH=. "
                "from that folder)")
    if isinstance(root, ModuleNotFoundError) and root.name:
        return f"importing it needs the module {root.name!r}, which is not installed"
    if isinstance(root, AttributeError):
        return str(root)
    lines = str(root).strip().splitlines()
    return f"{type(root).__name__}: {lines[0]}" if lines else type(root).__name__
