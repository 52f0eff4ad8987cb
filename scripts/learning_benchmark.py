"""Learning benchmark: held-out greedy accuracy of the multiplication experiment on the default
model, before training and after N steps, for each algorithm over several seeds — one Hydra
multirun. Reports each configuration's mean and spread over the seeds, never one lucky run.

    python scripts/learning_benchmark.py                                  # grpo, dapo, dr_grpo x seeds 0,1
    python scripts/learning_benchmark.py --algorithms grpo --seeds 0,1,2 reward.terms.format.weight=0

Prints a Markdown table (accuracy before; after: mean, standard deviation, each seed; smallest gain;
wall time) and writes a PNG of the curves (`rlvr plot` over the runs) into the sweep folder (--out),
or where --png says. Each run takes about as long as `make train` (8-12 minutes on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from rlvr.plot import plot
from rlvr.sweep import by_config, summarise_sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="trainer.max_steps (default: the experiment's)")
    parser.add_argument("--eval-every", type=int, default=None, help="trainer.eval_every (default: the experiment's)")
    parser.add_argument("--algorithms", default="grpo,dapo,dr_grpo")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", type=Path, default=Path("multirun") / f"learning-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--png", type=Path, default=None,
                        help="PNG of the curves (default: learning_benchmark.png in the --out folder; "
                             "docs/learning_benchmark.png is the docs', replace it on purpose only)")
    parser.add_argument("overrides", nargs="*", help="further rlvr train overrides (comma lists sweep)")
    args = parser.parse_args()

    rlvr = str(Path(sys.executable).with_name("rlvr"))
    command = [rlvr, "train", "-m", "+experiment=multiplication", f"algorithm={args.algorithms}",
               f"seed={args.seeds}", "trainer.save_model=false", f"hydra.sweep.dir={args.out}",
               *([f"trainer.max_steps={args.steps}"] if args.steps else []),
               *([f"trainer.eval_every={args.eval_every}"] if args.eval_every else []), *args.overrides]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)

    print("\n| configuration | seeds | accuracy before | after: mean ± sd | each seed | smallest gain | wall time |")
    print("|---|---|---|---|---|---|---|")
    for c in by_config(summarise_sweep(args.out)):
        spread = f" ± {c['final_std']:.3f}" if c["final_std"] is not None else ""
        print(f"| {c['config']} | {c['seeds']} | {c['start_mean']:.3f} | {c['final_mean']:.3f}{spread} | {c['finals']}"
              f" | {c['gain_min']:+.3f} | {c['wall_min']:.1f} min |")
    runs = sorted(p for p in args.out.iterdir() if (p / "summary.json").is_file())
    print(f"\ncurves: {plot(runs, args.png or args.out / 'learning_benchmark.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
