"""The cold-start recipe over seeds, and the table of what each stage reached (docs/results.md).

    python scripts/cold_start.py                                         # the written-out recipe, seeds 0-2
    python scripts/cold_start.py --experiment multiplication_tool_sft --seeds 0 1 2
    python scripts/cold_start.py --report-only --transfer 5x2 --where-wrong   # the table of runs done, and more

For each seed, `rlvr train +experiment=EXPERIMENT seed=N` (the recipe: cold start, then RL) into
`OUT/EXPERIMENT/seed-N` (skipped when done; continued with trainer.resume=auto when cut off). Then
`rlvr eval` of the cold start's model and of the final model on operand sizes and a wording that the
demonstrations never used (`--transfer 5x2 reworded`: 5 x 2 digits, the 4 x 2 problems in other words).
Printed: held-out greedy accuracy before, after the cold start and after RL, per seed and as mean ±
sd, the share of answers that call a tool where the task has tools, the wall time of each stage, and
the transfer evaluations.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

RLVR = str(Path(sys.executable).with_name("rlvr"))
# Evaluations on what the demonstrations never showed: (name, overrides).
TRANSFER = {"5x2": ["data.levels=[[5,2]]"],
            "reworded": ["data.template='Multiply {a} by {b}. Write the product inside <answer></answer>.'"]}


def _evals(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "eval/accuracy" in x]


def _eval(model: Path, experiment: str, overrides: list[str], out: Path) -> dict:
    if not (out / "eval.json").is_file():
        subprocess.run([RLVR, "eval", f"+experiment={experiment}", "model=local", f"model.path={model}", *overrides,
                        f"hydra.run.dir={out}"], check=True, capture_output=True, text=True)
    return json.loads((out / "eval.json").read_text())


def where_wrong(question: str, completion: str) -> str:
    """Where a written-out answer to "What is a * b?" first goes wrong: `right`, `partial product` (a line
    a * p = x with x wrong), `sum` (s + t = u with u wrong), `copied` (a line that uses a wrong operand or
    a partial product it never wrote), `answer` (the tag differs from the last line) or `format`."""
    a, b = (int(x) for x in re.search(r"(\d+) \* (\d+)", question).groups())
    wanted = {int(d) * 10**i for i, d in enumerate(reversed(str(b))) if d != "0"}
    written: list[int] = []
    last = None
    for line in completion.splitlines():
        if m := re.fullmatch(r"(\d+) \* (\d+) = (\d+)", line.strip()):
            x, p, y = map(int, m.groups())
            if x != a or p not in wanted:
                return "copied"
            if y != x * p:
                return "partial product"
            written.append(y)
            last = y
        elif m := re.fullmatch(r"(\d+) \+ (\d+) = (\d+)", line.strip()):
            x, y, z = map(int, m.groups())
            if x not in {last, *written} or y not in written:
                return "copied"
            if z != x + y:
                return "sum"
            last = z
        elif m := re.fullmatch(r"<answer>(\d+)</answer>", line.strip()):
            return "right" if int(m.group(1)) == a * b else ("answer" if int(m.group(1)) != last else "copied")
    return "format"


def _where(eval_dir: Path) -> collections.Counter:
    rows = [json.loads(x) for x in (eval_dir / "eval_samples.jsonl").read_text().splitlines()]
    return collections.Counter(where_wrong(r["messages"][-1]["content"], r["completion"]) for r in rows
                               if r["decoding"] == "greedy")


def _mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="multiplication_4x2_sft")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs"))
    parser.add_argument("--report-only", action="store_true", help="no new runs: the table of those done")
    parser.add_argument("--transfer", nargs="*", choices=sorted(TRANSFER), default=[],
                        help="also evaluate on 5 x 2 digits and/or reworded prompts")
    parser.add_argument("--where-wrong", action="store_true",
                        help="where each written-out answer first goes wrong, after each stage (rlvr eval)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        run_dir = args.out / args.experiment / f"seed-{seed}"
        if not (run_dir / "summary.json").is_file():
            if args.report_only:
                continue
            subprocess.run([RLVR, "train", f"+experiment={args.experiment}", f"seed={seed}", "trainer.resume=auto",
                            *args.overrides, f"hydra.run.dir={run_dir}"], check=True)
        sft, rl = _evals(run_dir / "sft"), _evals(run_dir)
        row = {"seed": seed, "before": sft[0], "cold": sft[-1], "during": sft[1:-1], "rl": rl[-1],
               "sft_min": json.loads((run_dir / "sft" / "summary.json").read_text())["wall_s"] / 60,
               "rl_min": json.loads((run_dir / "summary.json").read_text())["wall_s"] / 60}
        if args.transfer:
            for name in args.transfer:
                overrides = TRANSFER[name]
                row[name] = [_eval(run_dir / stage / "model", args.experiment, overrides,
                                   run_dir / f"eval-{name}-{stage or 'rl'}")["eval/accuracy"]
                             for stage in ("sft", "")]
        if args.where_wrong:
            row["where"] = [_where(run_dir / f"eval-heldout-{stage or 'rl'}") if _eval(
                run_dir / stage / "model", args.experiment, [], run_dir / f"eval-heldout-{stage or 'rl'}") else None
                for stage in ("sft", "")]
        rows.append(row)
    if not rows:
        sys.exit(f"no finished run under {args.out / args.experiment}")
    tools = "eval/tools/call_frac" in rows[0]["rl"]
    print(f"{args.experiment}, seeds {[r['seed'] for r in rows]}: held-out greedy accuracy")
    print("| seed | before | after the cold start | after RL | RL's gain | "
          + ("calls a tool (cold start -> RL) | " if tools else "") + "minutes (cold start + RL) |")
    print("|---|---|---|---|---|" + ("---|" if tools else "") + "---|")
    for r in rows:
        call = (f"{r['cold']['eval/tools/call_frac']:.2f} -> {r['rl']['eval/tools/call_frac']:.2f} | " if tools else "")
        print(f"| {r['seed']} | {r['before']['eval/accuracy']:.3f} | {r['cold']['eval/accuracy']:.3f} | "
              f"{r['rl']['eval/accuracy']:.3f} | {r['rl']['eval/accuracy'] - r['cold']['eval/accuracy']:+.3f} | "
              f"{call}{r['sft_min']:.1f} + {r['rl_min']:.1f} |")
    cold = [r["cold"]["eval/accuracy"] for r in rows]
    final = [r["rl"]["eval/accuracy"] for r in rows]
    print(f"| mean ± sd | {_mean_sd([r['before']['eval/accuracy'] for r in rows])} | {_mean_sd(cold)} | "
          f"{_mean_sd(final)} | {_mean_sd([f - c for f, c in zip(final, cold, strict=True)])} | "
          + (f"{_mean_sd([r['rl']['eval/tools/call_frac'] for r in rows])} | " if tools else "")
          + f"{_mean_sd([r['sft_min'] + r['rl_min'] for r in rows])} |")
    if args.transfer:
        print("\n| seed | " + " | ".join(f"{n}: cold start | {n}: after RL" for n in args.transfer) + " |")
        print("|---|" + "---|---|" * len(args.transfer))
        for r in rows:
            print(f"| {r['seed']} | " + " | ".join(f"{r[n][0]:.3f} | {r[n][1]:.3f}" for n in args.transfer) + " |")
        print("| mean ± sd | " + " | ".join(f"{_mean_sd([r[n][0] for r in rows])} | {_mean_sd([r[n][1] for r in rows])}"
                                            for n in args.transfer) + " |")
    if args.where_wrong:
        kinds = ["right", "partial product", "sum", "copied", "answer", "format"]
        print("\nwhere each held-out answer first goes wrong (cold start -> after RL)\n| seed | "
              + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
        for r in rows:
            print(f"| {r['seed']} | " + " | ".join(f"{r['where'][0][k]} -> {r['where'][1][k]}" for k in kinds) + " |")


if __name__ == "__main__":
    main()
