"""After a Hydra multirun: a table of each run's overrides against its results.

Registered as a Hydra callback in configs/train.yaml; writes `sweep_summary.csv` into the sweep
dir and prints the table, sorted by final eval accuracy (best first).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from rlvr.plot import differing_overrides

log = logging.getLogger("rlvr")


def summarise_sweep(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per finished run under `sweep_dir`: the overrides that differ between runs, final
    reward, final eval accuracy and wall time; sorted by eval accuracy, best first."""
    runs = sorted((p for p in sweep_dir.iterdir() if (p / "summary.json").is_file()), key=lambda p: p.name)
    rows = []
    for run, overrides in zip(runs, differing_overrides(runs), strict=True):
        summary = json.loads((run / "summary.json").read_text())
        rows.append({
            "run": run.name,
            "overrides": overrides,
            "final_reward": summary["last_step"].get("reward/mean"),
            "eval_accuracy": summary["final_eval"].get("eval/accuracy"),
            "eval_accuracy_start": summary["first_eval"].get("eval/accuracy"),
            "wall_s": round(summary["wall_s"], 1),
        })
    rows.sort(key=lambda r: -(r["eval_accuracy"] or 0.0))
    return rows


class SweepSummary(Callback):
    """Hydra callback: the summary table at the end of a multirun."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = summarise_sweep(sweep_dir)
        if not rows:
            log.warning("sweep %s: no run finished, no summary written", sweep_dir)
            return
        with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        Console().print(sweep_table(rows, f"sweep {sweep_dir} ({len(rows)} runs, best eval accuracy first)"))
        log.info("sweep summary: %s", sweep_dir / "sweep_summary.csv")


def sweep_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The rows of `summarise_sweep` as a rich table that never cuts a cell.

    A console narrower than the table (80 columns when the output is piped) makes rich shrink the
    columns, and by default cut what no longer fits with "…": the overrides that tell the runs apart
    lost their ends. Here a cell wraps at spaces, then folds mid-word; headers wrap at spaces too."""
    table = Table(title=title)
    for column in rows[0]:
        text = column in ("run", "overrides")
        # numbers keep to 8 characters (their headers wrap at spaces) and leave the room to the overrides
        table.add_column(column.replace("_", " "), justify="left" if text else "right", overflow="fold",
                         max_width=None if text else 8)
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.1f}" if k == "wall_s" else f"{v:.3f}" if isinstance(v, float)
                        else str(v) for k, v in row.items()))
    return table
