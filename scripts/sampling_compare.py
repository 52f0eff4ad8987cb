"""Difficulty-aware sampling against uniform on a dataset of mixed difficulty (docs/results.md,
"Difficulty-aware sampling against uniform").

    python scripts/sampling_compare.py                     # seeds 0-2, both arms
    python scripts/sampling_compare.py --seeds 0 1 --report-only

The dataset: multiplication problems a × b with digits (1,1), (2,1), (2,2), (3,2), (4,2), 80 of each,
seeded, written as JSONL to `OUT/problems.jsonl` (column `level`: the metrics split by it,
`eval/accuracy/<level>`); the file task holds 100 rows out by a hash. Each arm is `rlvr train
data=jsonl reward=multiplication algorithm=dapo` with `make train`'s sizes (the default model; DAPO's
dynamic sampling on, so that the rollouts it discards are counted) and
`data.sampling.mode=uniform|difficulty`, into `OUT/<arm>/seed-N` (skipped when done). Printed, per
seed and as mean ± sd: held-out accuracy at every evaluation, the first step at which it reached
`--target`, the share of zero-signal groups in the first round (`groups/zero_adv_frac`), the rollouts
discarded per step, and the wall time.
"""

from __future__ import annotations

import json
import random
import statistics
from argparse import ArgumentParser, RawDescriptionHelpFormatter
from pathlib import Path

from study import RLVR, run_once

DIGITS = [(1, 1), (2, 1), (2, 2), (3, 2), (4, 2)]
# `make train`'s experiment (+experiment=multiplication) but for its data
MAKE_TRAIN = ["data.batch_size=4", "algorithm.group_size=8", "rollout.temperature=0.7", "rollout.max_tokens=48",
              "optim.lr=1e-5"]
TEMPLATE = "What is {a} * {b}? Give the final answer in <answer></answer> tags."


def write_problems(path: Path, per_level: int = 80) -> None:
    rng, rows, seen = random.Random(0), [], set()
    for da, db in DIGITS:
        while sum(r["level"] == f"{da}x{db}" for r in rows) < per_level:
            a, b = rng.randint(10 ** (da - 1), 10**da - 1), rng.randint(10 ** (db - 1), 10**db - 1)
            if (a, b) not in seen:
                seen.add((a, b))
                rows.append({"question": TEMPLATE.format(a=a, b=b), "answer": str(a * b), "level": f"{da}x{db}"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mean_sd(values: list[float], digits: int = 3) -> str:
    if len(values) > 1:
        return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"
    return f"{values[0]:.{digits}f}"


def main() -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["uniform", "difficulty"], choices=["uniform", "difficulty"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--target", type=float, default=0.3, help="the held-out accuracy whose first step is reported")
    parser.add_argument("--out", type=Path, default=Path("runs/sampling"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the table of those done")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    problems = args.out / "problems.jsonl"
    if not problems.is_file():
        write_problems(problems)
    done = {}
    for arm in args.arms:
        for seed in args.seeds:
            run_dir = args.out / arm / f"seed-{seed}"
            command = [RLVR, "train", "algorithm=dapo", "data=jsonl", f"data.path={problems.resolve()}",
                       "data.prompt_key=question", "data.eval_size=100", "data.system_prompt=null",
                       "reward=multiplication", f"data.sampling.mode={arm}", *MAKE_TRAIN, f"trainer.max_steps={args.steps}",
                       "trainer.eval_every=5", "trainer.save_model=false", f"seed={seed}", *args.overrides,
                       f"hydra.run.dir={run_dir}"]
            if not run_once(command, run_dir, args.report_only):
                continue
            done[arm, seed] = run_dir
    levels = [f"{a}x{b}" for a, b in DIGITS]
    print(f"\n| arm | seed | held-out accuracy at each evaluation (step: accuracy) | first step ≥ {args.target} | "
          f"final {' / '.join(levels)} | zero-signal groups | rollouts discarded / step | wall time (min) |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, list[tuple]] = {}
    for (arm, seed), run_dir in sorted(done.items()):
        rs = records(run_dir)
        evals = {r["step"]: r["eval/accuracy"] for r in rs if "eval/accuracy" in r}
        steps = [r for r in rs if "time/step_s" in r]
        reached = next((s for s, a in sorted(evals.items()) if a >= args.target), None)
        zero = statistics.mean(r["groups/zero_adv_frac"] for r in steps)
        discarded = statistics.mean(r["rollouts/discarded"] for r in steps)
        wall = json.loads((run_dir / "summary.json").read_text())["wall_s"] / 60
        curve = ", ".join(f"{s}: {a:.2f}" for s, a in sorted(evals.items()))
        final = next(r for r in reversed(rs) if "eval/accuracy" in r)
        per_level = " / ".join(f"{final.get(f'eval/accuracy/{level}', float('nan')):.2f}" for level in levels)
        print(f"| {arm} | {seed} | {curve} | {reached if reached is not None else 'not reached'} | {per_level} | "
              f"{zero:.2f} | {discarded:.1f} | {wall:.1f} |")
        summary.setdefault(arm, []).append((evals[max(evals)], zero, discarded, wall))
    print("\n| arm | final held-out accuracy | zero-signal groups | rollouts discarded / step | wall time (min) | seeds |")
    print("|---|---|---|---|---|---|")
    for arm, rows in summary.items():
        cols = list(zip(*rows, strict=True))
        print(f"| {arm} | {mean_sd(cols[0])} | {mean_sd(cols[1], 2)} | {mean_sd(cols[2], 1)} | {mean_sd(cols[3], 1)} | "
              f"{len(rows)} |")


if __name__ == "__main__":
    main()
