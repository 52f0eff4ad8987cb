"""Reward calls in worker processes, each bounded by a timeout after which its worker is killed.

Used when `reward.workers > 0`: a reward that hangs (even inside C code, where no signal reaches
it) or burns CPU cannot stall the training loop. Workers are started with "spawn" (forking a
process that holds vLLM's and torch's threads is unsafe); each imports the reward functions once
by their dotted paths, so a user's reward only has to be importable, not picklable.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from multiprocessing.connection import Connection, wait

from rlvr.records import Prompt

# A call: (term name, completion, prompt). Its outcome: (value, None) or (None, error message).
Call = tuple[str, str, Prompt]
Outcome = tuple[float | None, str | None]


def _serve(conn: Connection, specs: dict[str, tuple[str, dict]]) -> None:
    """Worker loop: import the reward functions, then answer calls until the pipe closes."""
    import functools
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which stops after its step

    from hydra.utils import get_method

    fns = {name: functools.partial(get_method(target), **kwargs) for name, (target, kwargs) in specs.items()}
    while True:
        try:
            index, name, completion, prompt = conn.recv()
        except EOFError:
            return
        try:
            conn.send((index, float(fns[name](completion, prompt)), None))
        except Exception as e:
            conn.send((index, None, f"{type(e).__name__}: {e}"))


class RewardPool:
    """`size` worker processes; `run` scores a list of calls and returns one outcome per call."""

    def __init__(self, specs: dict[str, tuple[str, dict]], size: int, timeout_s: float | None):
        self.specs, self.size, self.timeout_s = specs, size, timeout_s
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[tuple[multiprocessing.Process, Connection]] = []

    def _start(self) -> tuple[multiprocessing.Process, Connection]:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=_serve, args=(child, self.specs), daemon=True, name="rlvr-reward")
        process.start()
        child.close()
        return process, parent

    def run(self, calls: list[Call]) -> list[Outcome]:
        while len(self.workers) < self.size:  # started on first use, and again after a kill
            self.workers.append(self._start())
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = deque(enumerate(calls))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (call index, deadline)
        while pending or busy:
            for slot in range(self.size):
                if slot not in busy and pending:
                    index, (name, completion, prompt) = pending.popleft()
                    try:
                        self.workers[slot][1].send((index, name, completion, prompt))
                    except OSError:  # the worker died while idle: replace it and send again
                        self._replace(slot)
                        self.workers[slot][1].send((index, name, completion, prompt))
                    busy[slot] = (index, time.monotonic() + (self.timeout_s or float("inf")))
            first_deadline = min(deadline for _, deadline in busy.values())
            ready = wait([self.workers[slot][1] for slot in busy],
                         timeout=None if first_deadline == float("inf") else max(0.0, first_deadline - time.monotonic()))
            for slot in list(busy):
                process, conn = self.workers[slot]
                index, deadline = busy[slot]
                if conn in ready:
                    try:
                        got, value, error = conn.recv()
                        outcomes[got] = (value, error)
                    except EOFError:  # the worker died mid-call (e.g. the reward called os._exit)
                        process.join(timeout=5)
                        outcomes[index] = (None, f"the reward worker died (exit code {process.exitcode})")
                        self._replace(slot)
                    del busy[slot]
                elif time.monotonic() >= deadline:
                    outcomes[index] = (None, f"timed out after {self.timeout_s:g} s (worker killed)")
                    self._replace(slot)
                    del busy[slot]
        return outcomes  # type: ignore[return-value]

    def _replace(self, slot: int) -> None:
        process, conn = self.workers[slot]
        process.kill()
        process.join()
        conn.close()
        self.workers[slot] = self._start()

    def close(self) -> None:
        for process, conn in self.workers:
            conn.close()  # the worker sees EOF and returns
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        self.workers = []
