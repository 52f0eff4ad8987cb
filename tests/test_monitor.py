"""The degenerate-policy monitor on metric sequences written by hand: each sign fires once, where it
appears, and a healthy run fires nothing."""

from __future__ import annotations

from rlvr.monitor import DegenerationMonitor


def _run(steps: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    monitor = DegenerationMonitor(["correct", "format"], window=3)
    return {i: flags for i, m in enumerate(steps, 1) if (flags := monitor.update(i, m))}


def _healthy(i: int) -> dict[str, float]:
    return {"accuracy": 0.2 + 0.02 * i, "reward/correct": 0.2 + 0.02 * i, "reward/format": 0.5,
            "completion_len/mean": 30.0, "entropy/sampled": 0.8, "grad_norm": 2.0 + 0.1 * (i % 3)}


def test_a_healthy_run_raises_no_flag():
    assert _run([_healthy(i) for i in range(30)]) == {}


def test_format_rising_while_accuracy_falls_is_reward_hacking_once():
    steps = [_healthy(0)] * 6
    # steps 7-12: the format term climbs to 1.0 while accuracy sinks
    steps += [{**_healthy(0), "accuracy": 0.1, "reward/format": 0.9} for _ in range(6)]
    fired = _run(steps)
    assert list(fired) == [8]  # the last 3 steps' means moved by >= 0.05 first at step 8, then never again
    assert fired[8] == {"monitor/reward_hacking": 1.0}


def test_collapses_and_a_gradient_jump():
    steps = [_healthy(0)] * 6 + [{**_healthy(0), "completion_len/mean": 8.0, "entropy/sampled": 0.1}] * 3
    steps += [{**_healthy(0), "grad_norm": 7.0}]
    fired = _run(steps)
    # step 8: entropy's last 3 mean (0.8 + 0.1 + 0.1) / 3 = 0.33 < 0.5 x 0.8; length's (30 + 8 + 8) / 3 = 15.3
    # is not yet < 0.5 x 30, which it is at step 9 (8.0)
    assert fired[8] == {"monitor/entropy_collapse": 1.0}
    assert fired[9] == {"monitor/length_collapse": 1.0}
    assert fired[10] == {"monitor/grad_norm_jump": 1.0}  # 7.0 > 3 x median of 2.0-2.2
    assert set(fired) == {8, 9, 10}
