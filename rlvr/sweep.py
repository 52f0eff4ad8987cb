"""After a Hydra multirun: a table of each run's overrides against its results.

Registered as a Hydra callback in configs/train.yaml; writes `sweep_summary.csv` into the sweep
dir and prints the table, sorted by final eval accuracy (best first). When the sweep ran some
configuration with several seeds, it also writes `sweep_seeds.csv`: one row per configuration
with the mean and spread over its seeds of the held-out accuracy before and after training.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import statistics
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


_SEED = re.compile(r"(^| )seed=\S+")


def by_config(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of `summarise_sweep` grouped by their overrides without `seed=`: per configuration the
    seeds, held-out accuracy before (mean) and after (mean, sample standard deviation, each seed's
    value), the mean and smallest gain, and the mean wall time; best mean final accuracy first.

    >>> rows = [{"overrides": f"lr={lr} seed={s}", "eval_accuracy_start": 0.2, "eval_accuracy": acc, "wall_s": 60.0}
    ...         for lr, s, acc in [(1, 0, 0.3), (1, 1, 0.5), (2, 0, 0.2)]]
    >>> [(r["config"], r["seeds"], r["final_mean"], r["final_std"], r["gain_min"]) for r in by_config(rows)]
    [('lr=1', 2, 0.4, 0.1414, 0.1), ('lr=2', 1, 0.2, None, 0.0)]
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["eval_accuracy"] is not None and row["eval_accuracy_start"] is not None:
            groups.setdefault(" ".join(_SEED.sub(" ", row["overrides"]).split()), []).append(row)
    out = []
    for config, runs in groups.items():
        final = [r["eval_accuracy"] for r in runs]
        gains = [r["eval_accuracy"] - r["eval_accuracy_start"] for r in runs]
        out.append({
            "config": config or "(defaults)",
            "seeds": len(runs),
            "start_mean": round(statistics.mean(r["eval_accuracy_start"] for r in runs), 4),
            "final_mean": round(statistics.mean(final), 4),
            "final_std": round(statistics.stdev(final), 4) if len(final) > 1 else None,
            "gain_mean": round(statistics.mean(gains), 4),
            "gain_min": round(min(gains), 4),
            "finals": " ".join(f"{x:.3f}" for x in final),
            "wall_min": round(statistics.mean(r["wall_s"] for r in runs) / 60, 1),
        })
    out.sort(key=lambda r: -r["final_mean"])
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


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
        write_csv(rows, sweep_dir / "sweep_summary.csv")
        Console().print(sweep_table(rows, f"sweep {sweep_dir} ({len(rows)} runs, best eval accuracy first)"))
        log.info("sweep summary: %s", sweep_dir / "sweep_summary.csv")
        configs = by_config(rows)
        if any(c["seeds"] > 1 for c in configs):
            write_csv(configs, sweep_dir / "sweep_seeds.csv")
            Console().print(sweep_table(configs, f"sweep {sweep_dir}: mean and spread over seeds"))
            log.info("over seeds: %s", sweep_dir / "sweep_seeds.csv")


def sweep_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The rows of `summarise_sweep` as a rich table that never cuts a cell.

    A console narrower than the table (80 columns when the output is piped) makes rich shrink the
    columns, and by default cut what no longer fits with "…": the overrides that tell the runs apart
    lost their ends. Here a cell wraps at spaces, then folds mid-word; headers wrap at spaces too."""
    table = Table(title=title)
    for column in rows[0]:
        text = column in ("run", "overrides", "config", "finals")
        # numbers keep to 8 characters (their headers wrap at spaces) and leave the room to the overrides
        table.add_column(column.replace("_", " "), justify="left" if text else "right", overflow="fold",
                         max_width=None if text else 8)
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.1f}" if k in ("wall_s", "wall_min") else f"{v:.3f}" if isinstance(v, float)
                        else str(v) for k, v in row.items()))
    return table
