"""The base of every error that is the user's to fix (a bad key, a missing file, a corrupt
checkpoint): the CLI prints its message alone, without a traceback, and exits with status 1."""


class RlvrError(Exception):
    """An error whose message says what was wrong, where, and what would fix it."""
