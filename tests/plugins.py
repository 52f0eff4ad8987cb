"""Rewards that misbehave on purpose (for the safety tests), importable by dotted path from reward workers."""

from __future__ import annotations

import os
import time


def hang(completion: str, prompt) -> float:
    """Never returns for a completion containing "hang" (sleeps in C: no signal ends it early in a worker)."""
    if "hang" in completion:
        time.sleep(3600)
    return 1.0


def spin(completion: str, prompt) -> float:
    """A pure-Python busy loop for "spin": the in-process timer must interrupt it."""
    while "spin" in completion:
        pass
    return 1.0


def crash(completion: str, prompt) -> float:
    """Kills its own process for "crash" (a segfaulting C extension looks the same from outside)."""
    if "crash" in completion:
        os._exit(3)
    return 1.0


def pid(completion: str, prompt) -> float:
    """The process id that scored the call."""
    return float(os.getpid())
