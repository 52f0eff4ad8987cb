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
