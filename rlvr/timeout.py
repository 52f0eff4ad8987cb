"""One call under a wall-clock limit, in this process: reward terms and tools use it.

The limit is a SIGALRM timer, so it interrupts Python code (a loop, a sleep) but not a C call that
never returns; where that matters, run the call in another process (`reward.workers`, the Python
tool's sandbox). Off the main thread no signal can be delivered and the call runs unbounded.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


class CallTimeout(Exception):
    """Raised inside a call that ran past its limit."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> tuple[Any, str | None]:
    """`(fn(), None)`, or `(None, what went wrong)` when it raised or ran past `timeout_s` seconds
    (None or 0: no limit)."""
    timed = bool(timeout_s) and threading.current_thread() is threading.main_thread()

    def expire(signum, frame):
        raise CallTimeout

    previous = signal.signal(signal.SIGALRM, expire) if timed else None
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        return fn(), None
    except CallTimeout:
        return None, f"timed out after {timeout_s:g} s"
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
