"""`rlvr plot RUN_DIR [RUN_DIR ...] [--out PNG]`: training curves from metrics.jsonl, runs overlaid, as
one PNG: by default the run's own curves.png for one run, a new curves-<date>-<time>.png in the
current directory for several.

Panels: reward, training accuracy, held-out eval accuracy, completion length, KL, clip fraction,
engine/learner mismatch, entropy of the sampled tokens, curriculum level, the loss, and the step-time
breakdown (of the first run). A cold start's run dir (rlvr sft) draws its loss, eval accuracy and times.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path

from omegaconf import OmegaConf

PANELS = [
    ("reward/mean", "reward (mean)"),
    ("accuracy", "training accuracy"),
    ("eval/accuracy", "eval accuracy (greedy, held out)"),
    ("completion_len/mean", "completion length (tokens)"),
    ("kl", "KL to reference"),
    ("clip_frac", "clipped token fraction"),
    ("mismatch/logprob_abs_mean", "|learner - sampler| logprob"),
    ("entropy/sampled", "entropy of the sampled tokens (nats)"),
    ("curriculum/level", "curriculum level"),
    ("loss", "loss (RL: the surrogate; cold start: NLL per token)"),
]
# The phases of a step (rlvr.metrics.StepTimes), stacked: together they are time/step_s.
TIMES = [f"time/{phase}_s" for phase in ("prompts", "rollout", "reward", "learn", "sync", "canary", "other")]


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run dir of `rlvr train`?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def differing_overrides(run_dirs: list[Path]) -> list[str]:
    """For each run, the command-line overrides (as Hydra recorded them in .hydra/overrides.yaml)
    that not every run shares; all of them when there is one run."""
    overrides = []
    for d in run_dirs:
        path = d / ".hydra" / "overrides.yaml"
        # read as YAML: Hydra's writer quotes some overrides and folds long ones over several lines
        overrides.append([str(x) for x in OmegaConf.to_container(OmegaConf.load(path))] if path.is_file() else [])
    common = set.intersection(*(set(o) for o in overrides)) if len(run_dirs) > 1 else set()
    return [" ".join(x for x in o if x not in common) for o in overrides]


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Name each run by the overrides that differ between the runs, else by its folder."""
    return [label or f"{d.parent.name}/{d.name}"
            for label, d in zip(differing_overrides(run_dirs), run_dirs, strict=True)]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot(run_dirs: list[Path], out: Path) -> Path:
    """Draw the curves of `run_dirs` into the PNG file `out`."""
    fig = figure(run_dirs)  # (first: it picks the file-only backend before pyplot loads)
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def figure(run_dirs: list[Path]):
    """The figure of `plot`: one panel per metric, each run in its own colour in every panel (a run that
    lacks a metric leaves its colour unused there, never handed to the next run), one legend of all runs."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    runs = list(zip(run_labels(run_dirs), [read_metrics(d) for d in run_dirs], strict=True))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = [palette[i % len(palette)] for i in range(len(runs))]
    fig, axes = plt.subplots(2, 6, figsize=(26, 8), constrained_layout=True)
    for ax, (key, title) in zip(axes.flat, PANELS, strict=False):
        drawn = False
        for (label, records), colour in zip(runs, colours, strict=True):
            steps, values = series(records, key)
            if values:  # (a marker for evaluations, and for a metric logged once or twice: a line alone shows nothing)
                marker = "o" if key.startswith("eval/") or len(values) <= 2 else None
                ax.plot(steps, values, marker=marker, markersize=3, color=colour, label=textwrap.fill(label, 70))
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not logged in these runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax = axes.flat[len(PANELS)]
    label, records = runs[0]
    bottom = None
    for key in TIMES:
        steps, values = series(records, key)
        if values:
            ax.bar(steps, values, bottom=bottom, label=key.removeprefix("time/").removesuffix("_s"))
            bottom = values if bottom is None else [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title("seconds per step" + (f"\n({textwrap.shorten(label, 45)})" if len(runs) > 1 else ""), fontsize=10)
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    handles = [Line2D([], [], color=colour, label=textwrap.fill(label, 70))
               for (label, _), colour in zip(runs, colours, strict=True)]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=9)
    return fig


def default_out(run_dirs: list[Path]) -> Path:
    """Where `rlvr plot` draws without --out: one run's own curves.png; for several runs a new file in
    the current directory (never one run's curves.png, which would then show the others too)."""
    if len(run_dirs) == 1:
        return run_dirs[0] / "curves.png"
    stem = f"curves-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = Path(f"{stem}.png"), 1
    while out.exists():
        n += 1
        out = Path(f"{stem}-{n}.png")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlvr plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run dirs holding metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG file (default: <run dir>/curves.png for one run; for several, a new "
                             "curves-<date>-<time>.png in the current directory)")
    args = parser.parse_args(argv)
    try:
        out = plot(args.run_dirs, args.out or default_out(args.run_dirs))
    except FileNotFoundError as e:
        parser.error(str(e))
    print(f"curves of {len(args.run_dirs)} run{'s' if len(args.run_dirs) > 1 else ''}: {out.resolve()}")
    return 0
