"""Signs of a degenerate policy, watched step by step: each warns once, in the log and in metrics.

A policy can raise its reward without learning the task. The monitor compares the mean of the last
`window` steps with the mean of the `window` steps before them (or, for collapses, with the first
`window` steps of the run) and raises a flag the first time a sign appears:

- `monitor/reward_hacking`: a reward term other than the accuracy term rose by at least `rise`
  while accuracy fell by at least `rise` (e.g. the format term paid for tags around a wrong answer);
- `monitor/length_collapse`: completions got shorter than `collapse` x their length at the start;
- `monitor/entropy_collapse`: the sampled tokens' entropy (`entropy/sampled`) fell below `collapse` x
  its value at the start;
- `monitor/grad_norm_jump`: the gradient norm rose above `jump` x the median of the steps before.

The flag is 1.0 in the metrics of the step where the sign first appeared, absent otherwise.
"""

from __future__ import annotations

import logging
import statistics

log = logging.getLogger("rlvr")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class DegenerationMonitor:
    def __init__(self, reward_terms: list[str], window: int = 5, rise: float = 0.05, collapse: float = 0.5,
                 jump: float = 3.0):
        self.terms = [f"reward/{t}" for t in reward_terms]
        self.window, self.rise, self.collapse, self.jump = window, rise, collapse, jump
        self.history: dict[str, list[float]] = {}
        self.fired: set[str] = set()

    def _signs(self, key: str) -> tuple[float, float, float] | None:
        """(mean of the first window, mean of the window before the last, mean of the last window)."""
        values, w = self.history.get(key, []), self.window
        if len(values) < 2 * w:
            return None
        return _mean(values[:w]), _mean(values[-2 * w : -w]), _mean(values[-w:])

    def update(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Record one step's metrics; return the flags that fire at this step (and warn about them)."""
        grad = metrics.get("grad_norm")
        before = self.history.get("grad_norm", [])
        for key in ("accuracy", "completion_len/mean", "entropy/sampled", "grad_norm", *self.terms):
            if metrics.get(key) is not None:
                self.history.setdefault(key, []).append(float(metrics[key]))
        found: dict[str, str] = {}
        accuracy = self._signs("accuracy")
        for term in self.terms:
            rewarded = self._signs(term)
            if accuracy and rewarded and rewarded[2] - rewarded[1] >= self.rise and accuracy[1] - accuracy[2] >= self.rise:
                found["reward_hacking"] = (f"{term} rose {rewarded[1]:.2f} -> {rewarded[2]:.2f} while accuracy fell "
                                           f"{accuracy[1]:.2f} -> {accuracy[2]:.2f} (mean of {self.window} steps)")
                break
        for key, name in (("completion_len/mean", "length_collapse"), ("entropy/sampled", "entropy_collapse")):
            signs = self._signs(key)
            if signs and signs[0] > 0 and signs[2] < self.collapse * signs[0]:
                found[name] = f"{key} fell from {signs[0]:.3g} to {signs[2]:.3g} (mean of {self.window} steps)"
        if grad is not None and len(before) >= self.window:
            median = statistics.median(before)
            if median > 0 and grad > self.jump * median:
                found["grad_norm_jump"] = f"grad_norm {grad:.3g} is {grad / median:.1f}x the median of the steps before"
        flags = {}
        for name, why in found.items():
            if name not in self.fired:
                self.fired.add(name)
                flags[f"monitor/{name}"] = 1.0
                log.warning("step %d: a sign of a degenerate policy (%s): %s", step, name.replace("_", " "), why)
        return flags
