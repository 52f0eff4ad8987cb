"""Rewards of the tests' own: ones that take their time (the signal tests) and one that any answer
earns; importable by dotted path from reward workers and from the CLI (with the repository on
PYTHONPATH)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path


def nap(completion: str, prompt, seconds: float = 0.5) -> float:
    """Sleeps `seconds`, then returns the id of the process that scored the call."""
    time.sleep(seconds)
    return float(os.getpid())


def stall(completion: str, prompt, gate: str, started: str, seconds: float = 3600) -> float:
    """0.0 at once, except for the first call (in any process) after the file `gate` exists: that one
    creates the file `started` and sleeps `seconds` (an hour: a step that will not end by itself)."""
    if os.path.exists(gate):
        with contextlib.suppress(FileExistsError):
            Path(started).touch(exist_ok=False)
            time.sleep(seconds)
    return 0.0


def answered(completion: str, prompt) -> float:
    """1.0 for any answer that is not blank: a task every sample passes, whatever the model learned."""
    return float(bool(completion.strip()))
