"""Rewards that take their time, for the signal tests; importable by dotted path from reward workers
and from the CLI (with the repository on PYTHONPATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def nap(completion: str, prompt, seconds: float = 0.5) -> float:
    """Sleeps `seconds`, then returns the id of the process that scored the call."""
    time.sleep(seconds)
    return float(os.getpid())


def stall(completion: str, prompt, gate: str, started: str) -> float:
    """0.0 at once until the file `gate` exists; from then on it creates the file `started` and sleeps
    for an hour: a step that will not end by itself."""
    if os.path.exists(gate):
        Path(started).touch()
        time.sleep(3600)
    return 0.0
