"""What a second stage adds after one cold start: RL alone, on-policy DPO from pairs the verifier ranks,
and DPO then RL, from the same cold-start model, over seeds (docs/results.md, "Preference tuning").

    python scripts/second_stage.py --cold-start runs/cold/model                    # seeds 0-2, every arm
    python scripts/second_stage.py --cold-start runs/cold/model --steps 12 --arms rl dpo
    python scripts/second_stage.py --cold-start runs/cold/model --report-only

Each arm is `rlvr train +experiment=EXPERIMENT model=local model.path=COLD recipe=[...]` into
`OUT/<arm>/seed-N` (skipped when done), with the same number of optimizer steps in all (`--steps`;
DPO then RL: half each), so that their wall times are alike; each run's wall time is printed beside
its accuracy. Printed: held-out greedy accuracy of the cold start's model and after each arm, per seed
and as mean ± sd, the gain of each, and each stage's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from study import RLVR, run_once


def arms(steps: int) -> dict[str, list[str]]:
    """The second stages compared, as `rlvr train` overrides."""
    half = steps // 2
    return {
        "rl": ["recipe=[rl]", f"trainer.max_steps={steps}"],
        "dpo": ["recipe=[dpo]", f"dpo.steps={steps}"],
        "dpo_rl": ["recipe=[dpo,rl]", f"dpo.steps={half}", f"trainer.max_steps={steps - half}"],
    }


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):+.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:+.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-start", type=Path, required=True, help="the cold start's model folder")
    parser.add_argument("--experiment", default="multiplication_4x2_sft")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of each arm's second stage")
    parser.add_argument("--arms", nargs="+", default=["rl", "dpo", "dpo_rl"], choices=["rl", "dpo", "dpo_rl"])
    parser.add_argument("--out", type=Path, default=Path("runs/second_stage"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the table of those done")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run (e.g. dpo.lr=1e-5)")
    args = parser.parse_args()
    table = {}
    for arm in args.arms:
        for seed in args.seeds:
            run_dir = args.out / arm / f"seed-{seed}"
            command = [RLVR, "train", f"+experiment={args.experiment}", "model=local",
                       f"model.path={args.cold_start.resolve()}", "sft.steps=0", *arms(args.steps)[arm],
                       f"seed={seed}", *args.overrides, f"hydra.run.dir={run_dir}"]
            if not run_once(command, run_dir, args.report_only):
                continue
            stages = [run_dir / "dpo", run_dir] if arm == "dpo_rl" else [run_dir]
            summaries = [_summary(s) for s in stages]
            table[arm, seed] = {"before": summaries[0]["first_eval"]["eval/accuracy"],
                                "stages": [s["final_eval"]["eval/accuracy"] for s in summaries],
                                "minutes": [s["wall_s"] / 60 for s in summaries]}
    print("\n| arm | seed | cold start | after the second stage | gain | wall time (min) |")
    print("|---|---|---|---|---|---|")
    for (arm, seed), r in sorted(table.items()):
        path = " → ".join(f"{a:.3f}" for a in r["stages"])
        print(f"| {arm} | {seed} | {r['before']:.3f} | {path} | {r['stages'][-1] - r['before']:+.3f} | "
              f"{' + '.join(f'{m:.1f}' for m in r['minutes'])} |")
    print("\n| arm | final accuracy, mean ± sd | gain, mean ± sd | seeds |")
    print("|---|---|---|---|")
    for arm in args.arms:
        rows = [r for (a, _), r in table.items() if a == arm]
        if rows:
            finals = [r["stages"][-1] for r in rows]
            print(f"| {arm} | {_mean_sd(finals).lstrip('+')} | {_mean_sd([r['stages'][-1] - r['before'] for r in rows])}"
                  f" | {len(rows)} |")


if __name__ == "__main__":
    main()
