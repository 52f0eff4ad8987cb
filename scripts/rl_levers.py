"""The seed's 4-digit x 2-digit recipe and its levers, per seed (docs/results.md).

    python scripts/rl_levers.py --seeds 1                                   # the cold start, then every arm
    python scripts/rl_levers.py --seeds 1 --arms hot g16 --steps 20         # some arms, 20 RL steps each
    python scripts/rl_levers.py --seeds 1 --report-only

For each seed:
1. The cold start of `+experiment=multiplication_4x2_sft`, ending where the held-out pass@G at the RL
   group size stops rising (`rlvr sft ... sft.eval_every=50 sft.plateau_patience=2`; `sft.steps` stays
   the most it runs) into OUT/seed-N/sft.
2. RL from that model, one run per arm (`rlvr train ... recipe=[rl] model=local model.path=OUT/seed-N/sft/model`)
   into OUT/seed-N/ARM, `--steps` RL steps (an arm's run already there is kept as it is):
   - base: the recipe's RL (16 prompts x 8 samples, temperature 1.0, lr 1e-5, GRPO);
   - hot: sampled at temperature 1.2 (exploration);
   - g16: 8 prompts x 16 samples (the same 128 rollouts a step, more chances of a mixed group);
   - dynamic: DAPO's dynamic sampling on (flat groups dropped, more prompts drawn, up to 3 rounds).
Printed: the cold start's held-out greedy accuracy and pass@G at each evaluation and where it ended, and
per arm the held-out greedy accuracy at each evaluation, RL's gain over the cold start, the groups
without signal (first round), the rollouts discarded a step and the wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from study import RLVR, run_once

EXPERIMENT = "+experiment=multiplication_4x2_sft"
COLD_START = ["sft.eval_every=50", "sft.plateau_patience=2", "sft.save_every=50"]
ARMS = {"base": [], "hot": ["rollout.temperature=1.2"], "g16": ["data.batch_size=8", "algorithm.group_size=16"],
        "dynamic": ["algorithm.dynamic_sampling.enabled=true"]}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=40, help="RL steps of each arm run here")
    parser.add_argument("--out", type=Path, default=Path("runs/levers"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the tables of those done")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    if not args.report_only:
        for seed in args.seeds:
            cold = args.out / f"seed-{seed}" / "sft"
            run_once([RLVR, "sft", EXPERIMENT, *COLD_START, f"seed={seed}", *args.overrides, f"hydra.run.dir={cold}"], cold)
            for arm in args.arms:
                run_dir = args.out / f"seed-{seed}" / arm
                run_once([RLVR, "train", EXPERIMENT, "recipe=[rl]", "sft.steps=0", "model=local",
                          f"model.path={(cold / 'model').resolve()}", f"trainer.max_steps={args.steps}",
                          "trainer.save_model=false", f"seed={seed}", *ARMS[arm], *args.overrides,
                          f"hydra.run.dir={run_dir}"], run_dir)

    print("\n| seed | cold start: held-out accuracy / pass@8 (step: greedy / pass@8) | ended at step | wall time (min) |\n"
          "|---|---|---|---|")
    cold_final = {}
    for seed in args.seeds:
        cold = args.out / f"seed-{seed}" / "sft"
        if not (cold / "summary.json").is_file():
            continue
        evals = [r for r in _records(cold) if "eval/accuracy" in r]
        summary = json.loads((cold / "summary.json").read_text())
        cold_final[seed] = summary["final_eval"]["eval/accuracy"]
        curve = ", ".join(f"{r['step']}: {r['eval/accuracy']:.3f} / {r.get('eval/pass@8', float('nan')):.3f}"
                          for r in evals)
        print(f"| {seed} | {curve} | {summary['steps']} | {summary['wall_s'] / 60:.1f} |")

    print("\n| seed | arm | held-out accuracy (RL step: accuracy) | RL's gain | groups without signal | "
          "rollouts discarded / step | sampled entropy | wall time (min) |\n|---|---|---|---|---|---|---|---|")
    gains: dict[str, list[float]] = {}
    for seed in args.seeds:
        for arm in ARMS:
            run_dir = args.out / f"seed-{seed}" / arm
            if not (run_dir / "summary.json").is_file():
                continue
            records = _records(run_dir)
            evals = [r for r in records if "eval/accuracy" in r]
            steps = [r for r in records if "groups/zero_adv_frac" in r]
            summary = json.loads((run_dir / "summary.json").read_text())
            gain = evals[-1]["eval/accuracy"] - evals[0]["eval/accuracy"]
            gains.setdefault(arm, []).append(gain)
            curve = ", ".join(f"{r['step']}: {r['eval/accuracy']:.3f}" for r in evals)
            print(f"| {seed} | {arm} | {curve} | {gain:+.3f} | "
                  f"{statistics.mean(r['groups/zero_adv_frac'] for r in steps):.2f} | "
                  f"{statistics.mean(r['rollouts/discarded'] for r in steps):.1f} | "
                  f"{statistics.mean(r['entropy/sampled'] for r in steps):.3f} | {summary['wall_s'] / 60:.1f} |")
    print("\n| arm | RL's gain, mean ± sd | seeds |\n|---|---|---|")
    for arm, values in gains.items():
        spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
        print(f"| {arm} | {statistics.mean(values):+.3f}{spread} | {len(values)} |")


if __name__ == "__main__":
    main()
