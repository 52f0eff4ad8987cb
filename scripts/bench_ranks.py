"""What the multi-process path costs: the same steps on 1 and on 2 ranks of this machine, side by side.

    python scripts/bench_ranks.py                        # tiny and the default model, 1 and 2 ranks
    python scripts/bench_ranks.py --models tiny --steps 6 learner.precision=fp32

Each run is `rlvr train +experiment=multiplication` as a user starts it (`launch.nproc_per_node=N`,
the cores split between the ranks), one after another. The table shows the mean over the steps after
the first (warm-up) of the step time and its parts, the rollout tokens per second of the whole world,
and the peak resident memory of the largest rank; `wall` is the whole command, engine starts and both
evaluations included. On a 2-core machine 2 ranks cannot be faster: each has one core, and the ranks
add their collectives, a second engine and the exchange of rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RLVR = str(Path(sys.executable).with_name("rlvr"))
KEYS = [("time/step_s", "step s"), ("time/rollout_s", "rollout s"), ("time/learn_s", "learn s"),
        ("time/sync_s", "sync s"), ("tokens_per_s", "tokens/s"), ("memory/rss_peak_gib", "peak RSS GiB")]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run(model: str, ranks: int, steps: int, overrides: list[str], out: Path) -> dict[str, float]:
    run_dir = out / f"{model}-{ranks}"
    t0 = time.perf_counter()
    result = subprocess.run([RLVR, "train", "+experiment=multiplication", f"model={model}",
                             f"launch.nproc_per_node={ranks}", f"trainer.max_steps={steps}", "trainer.eval_every=0",
                             "data.eval_size=8", "trainer.save_model=false", "trainer.log_samples=0",
                             "trainer.samples_every=0", f"hydra.run.dir={run_dir}", *overrides],
                            capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if result.returncode != 0:
        sys.exit(f"{model} on {ranks} ranks failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "time/step_s" in r][1:]  # the first step warms up
    row = {key: statistics.mean(r[key] for r in steps_) for key, _ in KEYS if key != "memory/rss_peak_gib"}
    row["memory/rss_peak_gib"] = steps_[-1]["memory/rss_peak_gib"]
    row["wall"] = wall
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated model configs")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run (the first is warm-up)")
    parser.add_argument("overrides", nargs="*", help="more rlvr train overrides, e.g. learner.precision=fp32")
    args = parser.parse_args()
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores; overrides: {args.overrides or 'none'}")
    print("| model | ranks | " + " | ".join(name for _, name in KEYS) + " | wall s |")
    print("|---" * (len(KEYS) + 3) + "|")
    with tempfile.TemporaryDirectory(prefix="bench_ranks-") as tmp:
        for model in args.models.split(","):
            for ranks in (1, 2):
                row = run(model, ranks, args.steps, args.overrides, Path(tmp))
                cells = [f"{row[key]:.3g}" for key, _ in KEYS]
                print(f"| {model} | {ranks} | " + " | ".join(cells) + f" | {row['wall']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
