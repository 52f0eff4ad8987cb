"""pass@k against hand-computed values; the sweep summary on run folders written here."""

from __future__ import annotations

import doctest
import json
import math

import pytest

from rlvr import evaluate
from rlvr.sweep import summarise_sweep


def test_doctests():
    result = doctest.testmod(evaluate)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("n, c, k, expected", [
    (8, 0, 1, 0.0),                                  # nothing right
    (8, 8, 3, 1.0),                                  # everything right
    (8, 2, 1, 2 / 8),                                # pass@1 = c / n
    (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 1 - 3/10 = 0.7
    (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),  # 1 - 21/252
    (4, 3, 2, 1.0),                                  # n - c < k: every 2-subset holds a right one
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert evaluate.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="0 < k <= n"):
        evaluate.pass_at_k(4, 1, 5)


def _run(folder, overrides, eval_acc, wall):
    folder.mkdir(parents=True)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (folder / "summary.json").write_text(json.dumps({
        "steps": 2, "wall_s": wall, "first_eval": {"eval/accuracy": 0.1}, "final_eval": {"eval/accuracy": eval_acc},
        "last_step": {"reward/mean": 0.5}}))


def test_sweep_summary_lists_differing_overrides_best_first(tmp_path):
    _run(tmp_path / "0", ["model=tiny", "optim.lr=1e-5"], 0.25, 10.0)
    _run(tmp_path / "1", ["model=tiny", "optim.lr=1e-6"], 0.75, 12.0)
    (tmp_path / "2").mkdir()  # a job that died before its summary: left out
    rows = summarise_sweep(tmp_path)
    assert [(r["run"], r["overrides"], r["eval_accuracy"]) for r in rows] == [
        ("1", "optim.lr=1e-6", 0.75), ("0", "optim.lr=1e-5", 0.25)]
    assert rows[0]["wall_s"] == 12.0 and rows[0]["eval_accuracy_start"] == 0.1
