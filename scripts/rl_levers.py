"""The seed's 4-digit x 2-digit recipe and its levers, per seed (docs/results.md).

    python scripts/rl_levers.py --seeds 1                                   # the cold start, then every arm
    python scripts/rl_levers.py --seeds 1 --arms hot g16 --steps 20         # some arms, 20 RL steps each
    python scripts/rl_levers.py --seeds 1 --report-only

For each seed:
1. The cold start of `+experiment=multiplication_4x2_sft`, ending where the held-out pass@G at the RL
   group size stops rising (`rlvr sft ... sft.eval_every=50 sft.plateau_patience=2`; `sft.steps` stays
   the most it runs) into OUT/seed-N/sft. Its checkpoint of step `--early` is kept as the model
   OUT/seed-N/sft-stepE; its other checkpoints are removed once it has ended.
2. RL from that model, one run per arm (`rlvr train ... recipe=[rl] model=local model.path=OUT/seed-N/sft/model`)
   into OUT/seed-N/ARM, `--steps` RL steps (an arm's run already there is kept as it is; its checkpoints go once it is done):
   - base: the recipe's RL (16 prompts x 8 samples, temperature 1.0, lr 1e-5, GRPO);
   - early: base, from the cold start's model at step `--early` (when the cold start ends);
   - hot: sampled at temperature 1.2 (exploration);
   - g16: 8 prompts x 16 samples (the same 128 rollouts a step, more chances of a mixed group);
   - difficulty: difficulty-aware sampling of the training prompts (data.sampling.mode=difficulty);
   - dynamic: DAPO's dynamic sampling on (flat groups dropped, more prompts drawn, up to 3 rounds);
   - small: 8 prompts x 8 samples (half the rollouts and rows a step: about twice the RL steps in one time).
Printed: the cold start's held-out greedy accuracy and pass@G at each evaluation and where it ended, and
per arm the held-out greedy accuracy at each evaluation, RL's gain over the model it started from, the
groups without signal (first round), the rollouts discarded a step and the training time. Times are
sums of the steps' own times (`time/step_s`: evaluations left out), which add up across resumes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from study import RLVR, run_once

EXPERIMENT = "+experiment=multiplication_4x2_sft"
COLD_START = ["sft.eval_every=50", "sft.plateau_patience=2", "sft.save_every=50", "trainer.keep_last=0"]
ARMS = {"base": [], "early": [], "hot": ["rollout.temperature=1.2"],
        "g16": ["data.batch_size=8", "algorithm.group_size=16"], "difficulty": ["data.sampling.mode=difficulty"],
        "dynamic": ["algorithm.dynamic_sampling.enabled=true"], "small": ["data.batch_size=8"]}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _minutes(records: list[dict], until: int | None = None) -> float:
    """The steps' own time, in minutes, up to step `until` (all by default)."""
    return sum(r["time/step_s"] for r in records if "time/step_s" in r and (until is None or r["step"] <= until)) / 60


def _spread(values: list[float], sign: bool = False) -> str:
    """The mean over seeds, ± their standard deviation where there are two or more."""
    mean = f"{statistics.mean(values):{'+' if sign else ''}.3f}"
    return mean + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def _keep_early(cold: Path, early: Path, step: int) -> None:
    """Keep the ended cold start's model of `step` as `early`; remove its checkpoints (the stage is done)."""
    checkpoint = cold / "checkpoints" / f"step-{step:06d}" / "model"
    if not early.is_dir() and checkpoint.is_dir():
        shutil.copytree(checkpoint, early.with_name(early.name + ".tmp"), dirs_exist_ok=True)
        early.with_name(early.name + ".tmp").rename(early)
    shutil.rmtree(cold / "checkpoints", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=40, help="RL steps of each arm run here")
    parser.add_argument("--early", type=int, default=300, help="the cold start's step the early arm starts from "
                        "(a multiple of its save_every, 50)")
    parser.add_argument("--out", type=Path, default=Path("runs/levers"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the tables of those done")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    if not args.report_only:
        for seed in args.seeds:
            cold = args.out / f"seed-{seed}" / "sft"
            run_once([RLVR, "sft", EXPERIMENT, *COLD_START, f"seed={seed}", *args.overrides, f"hydra.run.dir={cold}"], cold)
            early = args.out / f"seed-{seed}" / f"sft-step{args.early}"
            _keep_early(cold, early, args.early)
            for arm in args.arms:
                run_dir = args.out / f"seed-{seed}" / arm
                model = early if arm == "early" else cold / "model"
                if not model.is_dir():
                    print(f"{run_dir}: skipped, {model} is missing (the cold start ended before step {args.early}?)")
                    continue
                run_once([RLVR, "train", EXPERIMENT, "recipe=[rl]", "sft.steps=0", "model=local",
                          f"model.path={model.resolve()}", f"trainer.max_steps={args.steps}",
                          "trainer.save_model=false", f"seed={seed}", *ARMS[arm], *args.overrides,
                          f"hydra.run.dir={run_dir}"], run_dir)
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # (the arm is done: 1.6 GB each)

    print(f"\n| seed | cold start: held-out accuracy / pass@8 (step: greedy / pass@8) | ended at step | "
          f"training time to step {args.early} / to its end (min) |\n|---|---|---|---|")
    cold_minutes: dict[tuple[int, str], float] = {}
    for seed in args.seeds:
        cold = args.out / f"seed-{seed}" / "sft"
        if not (cold / "summary.json").is_file():
            continue
        records = _records(cold)
        cold_minutes[seed, "early"], cold_minutes[seed, "end"] = _minutes(records, args.early), _minutes(records)
        curve = ", ".join(f"{r['step']}: {r['eval/accuracy']:.3f} / {r.get('eval/pass@8', float('nan')):.3f}"
                          for r in records if "eval/accuracy" in r)
        steps = json.loads((cold / "summary.json").read_text())["steps"]
        print(f"| {seed} | {curve} | {steps} | {cold_minutes[seed, 'early']:.1f} / {cold_minutes[seed, 'end']:.1f} |")

    print("\n| seed | arm | held-out accuracy (RL step: accuracy) | RL's gain | groups without signal | "
          "rollouts discarded / step | sampled entropy | RL training time (min) | the whole recipe (min) |\n"
          "|---|---|---|---|---|---|---|---|---|")
    accuracy: dict[str, dict[int, list[float]]] = {}  # arm -> RL step -> one accuracy per seed
    gain: dict[str, dict[int, list[float]]] = {}
    for seed in args.seeds:
        for arm in ARMS:
            run_dir = args.out / f"seed-{seed}" / arm
            if not (run_dir / "summary.json").is_file():
                continue
            records = _records(run_dir)
            evals = [r for r in records if "eval/accuracy" in r]
            steps = [r for r in records if "groups/zero_adv_frac" in r]
            for r in evals:
                accuracy.setdefault(arm, {}).setdefault(r["step"], []).append(r["eval/accuracy"])
                gain.setdefault(arm, {}).setdefault(r["step"], []).append(r["eval/accuracy"] - evals[0]["eval/accuracy"])
            curve = ", ".join(f"{r['step']}: {r['eval/accuracy']:.3f}" for r in evals)
            rl = _minutes(records)
            whole = rl + cold_minutes.get((seed, "early" if arm == "early" else "end"), float("nan"))
            print(f"| {seed} | {arm} | {curve} | {evals[-1]['eval/accuracy'] - evals[0]['eval/accuracy']:+.3f} | "
                  f"{statistics.mean(r['groups/zero_adv_frac'] for r in steps):.2f} | "
                  f"{statistics.mean(r['rollouts/discarded'] for r in steps):.1f} | "
                  f"{statistics.mean(r['entropy/sampled'] for r in steps):.3f} | {rl:.1f} | {whole:.1f} |")
    print("\n| arm | held-out accuracy, mean ± sd over seeds (RL step: accuracy) | RL's gain (RL step: gain) | "
          "seeds |\n|---|---|---|---|")
    for arm in accuracy:
        later = [step for step in gain[arm] if step > 0]
        print(f"| {arm} | {', '.join(f'{step}: {_spread(values)}' for step, values in accuracy[arm].items())} | "
              f"{', '.join(f'{step}: {_spread(gain[arm][step], sign=True)}' for step in later)} | "
              f"{max(len(values) for values in accuracy[arm].values())} |")

if __name__ == "__main__":
    main()
