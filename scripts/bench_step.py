"""Benchmark a few training steps: the time of each phase of a step and tokens/s.

    python scripts/bench_step.py                                   # the default model
    python scripts/bench_step.py model=tiny                        # the tiny model
    python scripts/bench_step.py --steps 5 model=tiny data.batch_size=8

Any `rlvr train` override works. The first step is reported apart (warm-up); the table shows the
mean of the others. Speed is measured here, never asserted in tests: these machines are shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed

# Every phase of a step (they add up to time/step_s), then its throughput and size.
KEYS = ["time/prompts_s", "time/rollout_s", "time/reward_s", "time/learn_s", "time/sync_s", "time/canary_s",
        "time/other_s", "time/step_s", "tokens_per_s", "completion_len/mean", "learn/sequences",
        "sync/logprob_max_diff"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training steps (the first is warm-up)")
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides, e.g. model=tiny")
    args = parser.parse_args()

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=["+experiment=multiplication", f"trainer.max_steps={args.steps}",
                                                      "trainer.save_model=false", "trainer.log_samples=0",
                                                      *args.overrides]))
    from rlvr.train import train

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        train(cfg, Path(tmp))
        total = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step_s" in r]
    rest = steps[1:] or steps
    print(f"\nmodel {cfg.model.path}  ({cfg.data.batch_size} prompts x {cfg.algorithm.group_size} samples, "
          f"max_tokens {cfg.rollout.max_tokens}, {args.steps} steps, whole run incl. start-up and evals "
          f"{total:.1f} s)")
    print(f"{'metric':<24}{'step 1':>12}{'mean of rest':>14}")
    for key in KEYS:
        print(f"{key:<24}{steps[0][key]:>12.4g}{statistics.mean(r[key] for r in rest):>14.4g}")


if __name__ == "__main__":
    sys.exit(main())
