"""Learning benchmark: held-out accuracy of the multiplication experiment on the default model,
before training and after N steps, for grpo vs dapo vs dr_grpo — one Hydra multirun.

    python scripts/learning_benchmark.py                     # 15 steps each, eval every 5
    python scripts/learning_benchmark.py --steps 30 --eval-every 10 seed=1

Prints a Markdown table (accuracy before/after, steps, wall time) and writes a PNG of the curves
(`rlvr plot` over the three runs) into the sweep folder (--out), or where --png says. Takes ~10-15
minutes per algorithm on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rlvr.plot import plot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--algorithms", default="grpo,dapo,dr_grpo")
    parser.add_argument("--out", type=Path, default=Path("multirun") / f"learning-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--png", type=Path, default=None,
                        help="PNG of the curves (default: learning_benchmark.png in the --out folder; "
                             "docs/learning_benchmark.png is the README's, replace it on purpose only)")
    parser.add_argument("overrides", nargs="*", help="further rlvr train overrides")
    args = parser.parse_args()

    rlvr = str(Path(sys.executable).with_name("rlvr"))
    command = [rlvr, "train", "-m", "+experiment=multiplication", f"algorithm={args.algorithms}",
               f"trainer.max_steps={args.steps}", f"trainer.eval_every={args.eval_every}",
               "trainer.save_model=false", f"hydra.sweep.dir={args.out}", *args.overrides]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)

    runs = sorted(p for p in args.out.iterdir() if (p / "summary.json").is_file())
    print(f"\n| algorithm | eval accuracy before | after {args.steps} steps | best eval | wall time |")
    print("|---|---|---|---|---|")
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        name = json.loads((run / "manifest.json").read_text())["algorithm"]
        evals = [json.loads(x)["eval/accuracy"] for x in (run / "metrics.jsonl").read_text().splitlines()
                 if "eval/accuracy" in x]
        print(f"| {name} | {summary['first_eval']['eval/accuracy']:.3f} | {summary['final_eval']['eval/accuracy']:.3f}"
              f" | {max(evals):.3f} | {summary['wall_s'] / 60:.1f} min |")
    print(f"\ncurves: {plot(runs, args.png or args.out / 'learning_benchmark.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
