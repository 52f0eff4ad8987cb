"""A mixture against each of its sources alone, with the same steps (docs/results.md, "Mixtures").

    python scripts/mixture_vs_single.py                      # seeds 0-2: the mixture, each source alone
    python scripts/mixture_vs_single.py --seeds 0 --report-only
    python scripts/mixture_vs_single.py trainer.max_steps=20  # more overrides for every run

Each arm is `rlvr train +experiment=mixture` (multiplication and function picking, half each) into
`OUT/<arm>/seed-N` (skipped when done): `mixture` as it is, and `multiplication` / `function_picking`
a mixture of that source alone (the other one's defaults and node deleted), so that everything but
the data is the same: the cold start's and RL's steps, batch, group, learning rates. Printed: each
source's held-out greedy accuracy after the whole recipe, per seed and as mean ± sd, beside the
mixture's on the same source's held-out prompts, and each run's wall time.
"""

from __future__ import annotations

import json
import statistics
from argparse import ArgumentParser, RawDescriptionHelpFormatter
from pathlib import Path

from study import RLVR, run_once

SOURCES = ("multiplication", "function_picking")


def alone(source: str) -> list[str]:
    """The overrides that leave the mixture with `source` alone."""
    other = next(s for s in SOURCES if s != source)
    return [f"~data@data.sources.{other}.data", f"~reward@data.sources.{other}.reward", f"~data.sources.{other}"]


def accuracy(run_dir: Path, source: str, mixture: bool) -> float:
    """The source's held-out accuracy after the stage written in `run_dir` (the recipe's RL; its cold start's
    in `run_dir / "sft"`)."""
    final = json.loads((run_dir / "summary.json").read_text())["final_eval"]
    return final[f"eval/{source}/accuracy" if mixture else "eval/accuracy"]


def minutes(run_dir: Path) -> float:
    """The recipe's wall time: its cold start's and its RL stage's."""
    return sum(json.loads((d / "summary.json").read_text())["wall_s"] for d in (run_dir / "sft", run_dir)) / 60


def mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["mixture", *SOURCES], choices=["mixture", *SOURCES])
    parser.add_argument("--out", type=Path, default=Path("runs/mixture"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the table of those done")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    done: dict[tuple[str, int], Path] = {}
    for seed in args.seeds:  # (seed by seed: a study cut short has whole seeds)
        for arm in args.arms:
            run_dir = args.out / arm / f"seed-{seed}"
            command = [RLVR, "train", "+experiment=mixture", *([] if arm == "mixture" else alone(arm)),
                       f"seed={seed}", "trainer.save_model=false", *args.overrides, f"hydra.run.dir={run_dir}"]
            if not run_once(command, run_dir, args.report_only):
                continue
            done[arm, seed] = run_dir
    print("\n| source | seed | after the cold start, alone / in the mixture | after RL, alone | after RL, in the mixture "
          "| alone − mixture | wall time alone / mixture (min) |")
    print("|---|---|---|---|---|---|---|")
    for source in SOURCES:
        pairs = []
        for seed in args.seeds:
            if (source, seed) in done and ("mixture", seed) in done:
                a = accuracy(done[source, seed], source, False)
                m = accuracy(done["mixture", seed], source, True)
                pairs.append((a, m))
                cold = (f"{accuracy(done[source, seed] / 'sft', source, False):.3f} / "
                        f"{accuracy(done['mixture', seed] / 'sft', source, True):.3f}")
                print(f"| {source} | {seed} | {cold} | {a:.3f} | {m:.3f} | {a - m:+.3f} | "
                      f"{minutes(done[source, seed]):.1f} / {minutes(done['mixture', seed]):.1f} |")
        if pairs:
            print(f"| {source} | mean ± sd | | {mean_sd([a for a, _ in pairs])} | {mean_sd([m for _, m in pairs])} | "
                  f"{mean_sd([a - m for a, m in pairs])} | |")


if __name__ == "__main__":
    main()
