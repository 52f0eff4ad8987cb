"""The BFCL recipe's numbers for the results page, from finished runs of `+experiment=bfcl` and the
`rlvr eval` of their models on all 600 held-out questions:

    rlvr train +experiment=bfcl seed=0 hydra.run.dir=runs/bfcl_s0
    rlvr eval +experiment=bfcl model=local model.path=runs/bfcl_s0/sft/model data.eval_size=600 \
        eval.n_samples=0 hydra.run.dir=runs/bfcl_s0/eval_sft
    rlvr eval +experiment=bfcl model=local model.path=runs/bfcl_s0/model data.eval_size=600 \
        eval.n_samples=0 hydra.run.dir=runs/bfcl_s0/eval_rl
    python scripts/bfcl_report.py runs/bfcl_s0 runs/bfcl_s1 [--base runs/base_bfcl]

Prints, per seed and as mean ± sd, the AST accuracy on `multiple` and `simple_python` after each
stage; the time of each stage and the median seconds of a step's phases; the prompt tokens of a step;
and whether the leaderboard's own checker (bfcl-eval's `ast_checker`, its model registry stubbed as in
tests/test_bfcl.py) gives rlvr's verdict on every greedy answer the models wrote.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import types
from pathlib import Path

CATEGORIES = ("multiple", "simple_python")


def _eval(folder: Path) -> dict | None:
    path = folder / "eval.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "time/step_s" in r] if path.is_file() else []


def _median(records: list[dict], key: str) -> float:
    values = [r[key] for r in records[1:] if key in r]  # the first step compiles
    return statistics.median(values) if values else float("nan")


def _agreement(folders: list[Path]) -> tuple[int, int, int]:
    """(answers checked, verdicts that agree, answers rlvr scores 1) over the eval_samples.jsonl files."""
    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = collections.defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
    sys.modules.setdefault("bfcl_eval.constants.model_config", registry)
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    from rlvr.data.bfcl import load
    from rlvr.rewards.bfcl import parse_calls, why_not

    rows = {row["id"]: row for category in CATEGORIES for row in load(category)}
    checked = agree = right = 0
    for folder in folders:
        path = folder / "eval_samples.jsonl"
        if not path.is_file():
            continue
        for sample in map(json.loads, path.read_text().splitlines()):
            row = rows[sample["id"]]
            calls = parse_calls(sample["completion"])
            ours = calls is not None and why_not(calls, row["function"], row["ground_truth"]) is None
            if calls is None:
                theirs = False  # (no call the leaderboard could read either)
            else:
                theirs = ast_checker(row["function"], [{n: a} for n, a in calls], row["ground_truth"],
                                     Language.PYTHON, row["category"], "rlvr")["valid"]
            checked += 1
            agree += ours == theirs
            right += ours
    return checked, agree, right


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--base", type=Path, default=None, help="the rlvr eval dir of the base model")
    args = parser.parse_args(argv)
    if args.base and (base := _eval(args.base)):
        print("base model:", {c: base.get(f"eval/{c}/accuracy") for c in CATEGORIES})
    table = collections.defaultdict(list)
    for run in args.runs:
        line = [run.name]
        for stage in ("sft", "rl"):
            result = _eval(run / f"eval_{stage}")
            for c in CATEGORIES:
                value = result.get(f"eval/{c}/accuracy") if result else None
                table[(stage, c)].append(value)
                line.append(f"{stage} {c} {value if value is None else round(value, 3)}")
        sft, rl = _steps(run / "sft"), _steps(run)
        sft_wall = json.loads((run / "sft" / "summary.json").read_text())["wall_s"] if (run / "sft" / "summary.json").is_file() else None
        rl_wall = json.loads((run / "summary.json").read_text())["wall_s"] if (run / "summary.json").is_file() else None
        line.append(f"cold start {sft_wall and round(sft_wall / 60, 1)} min ({len(sft)} steps, median step "
                    f"{_median(sft, 'time/step_s'):.1f} s, {_median(sft, 'learn/tokens'):.0f} tokens)")
        line.append(f"RL {rl_wall and round(rl_wall / 60, 1)} min ({len(rl)} steps, median step "
                    f"{_median(rl, 'time/step_s'):.1f} s: rollout {_median(rl, 'time/rollout_s'):.1f}, learn "
                    f"{_median(rl, 'time/learn_s'):.1f}, sync {_median(rl, 'time/sync_s'):.2f}, "
                    f"{_median(rl, 'learn/tokens'):.0f} tokens learned)")
        print(" | ".join(line))
    for (stage, c), values in table.items():
        values = [v for v in values if v is not None]
        if values:
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"{stage} {c}: {statistics.mean(values):.3f} ± {sd:.3f} over {len(values)} seeds ({values})")
    try:
        checked, agree, right = _agreement([run / f"eval_{s}" for run in args.runs for s in ("sft", "rl")])
        print(f"leaderboard's checker: {agree} of {checked} greedy answers get its verdict ({right} scored 1)")
    except ImportError as e:
        print(f"leaderboard's checker not importable here ({e})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
