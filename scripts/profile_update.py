"""Where an RL update's time goes, beside the cold start's update on the same rows and the same machine.

    python scripts/profile_update.py                        # the 4 x 2 recipe's shapes, bf16-mixed
    python scripts/profile_update.py learner.precision=fp32
    python scripts/profile_update.py --ops 15               # and the 15 costliest torch ops of each arm

The rows are the recipe's own demonstrations (`+experiment=multiplication_4x2_sft`, default model), as
`scripts/bench_sft.py` draws them. The cold start's arm trains on them `sft.batch_size` a step, as
`rlvr sft` does. The RL arms train on a batch shaped as the recipe's RL step (`data.batch_size` groups of
`algorithm.group_size`): each group is one demonstration's prompt with the completions of
`group_size` demonstrations, every advantage nonzero (so every row runs, as when no group is flat), at
the recipe's settings and then with one setting changed at a time. Each arm runs in a fresh process
(no compiled code shared) for `--steps` steps, the first `--warmup` untimed. Printed per arm: seconds
per step, tokens per second (the rows' real tokens: prompt and completion, each row counted whole; in brackets the
tokens the forwards ran, each group's prompt once with the shared-prefix forward), and the seconds of
a step spent in the forwards, the backwards, gradient clipping and the AdamW step. With `--ops`, one
more step runs under torch's profiler (untimed) for the table of its costliest ops. Speed is measured
here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_sft import EXPERIMENT, config, rows

# (name, overrides): the recipe's RL update, then one setting changed at a time.
RL_ARMS = [
    ("rl", []),
    ("rl, compile off", ["learner.compile=false"]),
    ("rl, shared prefix off", ["learner.shared_prefix=false"]),
    ("rl, micro-batch 64", ["learner.micro_batch_size=64"]),
]


class Clock:
    """Seconds spent inside the wrapped callables, by name."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t0
        return timed


def rl_batch(demos, groups: int, size: int, pad_id: int, seed: int):
    """`groups` groups of `size` rows: group g asks demonstration g's prompt and answers with the
    completions of `size` demonstrations; advantages ±1 at random (every row runs)."""
    from rlvr.learner import make_batch
    from rlvr.records import Rollout

    out = []
    for g in range(groups):
        for j in range(size):
            d = demos[(g * size + j) % len(demos)]
            out.append(Rollout(demos[g].prompt, g, demos[g].prompt_ids, d.completion_ids,
                               [-0.5] * len(d.completion_ids), "", "stop", completion_mask=d.completion_mask))
    batch = make_batch(out, pad_id)
    rng = random.Random(seed)
    batch.advantages = torch.tensor([rng.choice((-1.0, 1.0)) for _ in out])
    return batch, sum(len(r.prompt_ids) + len(r.completion_ids) for r in out)


def arm(overrides: list[str], data: Path, steps: int, warmup: int, rl: bool, ops: int) -> dict:
    from rlvr.algorithms.objective import SFT
    from rlvr.learner import Learner, make_batch
    from rlvr.learner.precision import resolve
    from rlvr.records import Prompt, Rollout

    cfg = config(overrides)
    blob = json.loads(data.read_text())
    precision = resolve(cfg.learner.precision, cfg.rollout.dtype, None, "cpu")
    stage = "rl" if rl else "sft"
    learner = Learner(Path(blob["model"]), cfg.optim, cfg.algorithm, cfg.learner,
                      cfg.rollout.temperature if rl else 1.0, cfg.rollout.max_tokens, "cpu", precision,
                      schedule=cfg.schedule(stage), shared_prefix=None if rl else cfg.sft.packing,
                      with_reference=None if rl else False)
    demos = [Rollout(Prompt([], ""), k, r["prompt_ids"], r["completion_ids"], [0.0] * len(r["completion_ids"]), "",
                     "stop", completion_mask=r["mask"]) for k, r in enumerate(blob["rows"])]
    clock = Clock()
    scorer, optimizer = learner.scorer, learner.optimizer
    scorer.forward = clock.wrap("forward", scorer.forward)
    optimizer.step = clock.wrap("adamw", optimizer.step)
    learner._clip_gradients = clock.wrap("clip", learner._clip_gradients)
    backward = torch.Tensor.backward
    torch.Tensor.backward = clock.wrap("backward", backward)
    times, tokens, ran, spent = [], [], [], {}
    ops_table = None
    for step in range(steps + (1 if ops else 0)):  # (the profiled step, if any, after the timed ones)
        if rl:
            batch, real = rl_batch(demos, cfg.data.batch_size, cfg.algorithm.group_size, learner.policy.pad_id, step)
            objective = None
        else:
            B = cfg.sft.batch_size
            part = sorted(demos[step * B : (step + 1) * B], key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
            batch, real = make_batch(part, learner.policy.pad_id), sum(len(r.prompt_ids) + len(r.completion_ids)
                                                                      for r in part)
            objective = SFT()
        if step == steps:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
                learner.step(batch, objective)
            ops_table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=ops,
                                                      max_name_column_width=40)
            break
        clock.spent.clear()
        t0 = time.perf_counter()
        out = learner.step(batch, objective)
        elapsed = time.perf_counter() - t0
        if step >= warmup:
            times.append(elapsed)
            tokens.append(real)
            ran.append(out["learn/tokens"])
            for k, v in clock.spent.items():
                spent[k] = spent.get(k, 0.0) + v
    torch.Tensor.backward = backward
    total = sum(times)
    result = {"step_s": total / len(times), "tokens_per_s": sum(tokens) / total, "ran_tokens": sum(ran) / len(ran),
              "real_tokens": sum(tokens) / len(tokens), "rows": len(batch),
              "seconds": {k: v / len(times) for k, v in spent.items()}}
    if ops_table is not None:
        result["ops"] = ops_table
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="steps per arm (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps not timed (default 2)")
    parser.add_argument("--ops", type=int, default=0, help="print this many of each arm's costliest torch ops "
                        "(profiled over its last step)")
    parser.add_argument("--arms", nargs="+", help="only these arms (names as printed; 'sft' for the cold start)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides (default: +experiment=multiplication_4x2_sft)")
    args = parser.parse_args()
    if not any(o.startswith("+experiment=") for o in args.overrides):
        args.overrides = [EXPERIMENT, *args.overrides]
    if args.child:
        out = arm(args.overrides, Path(args.data), args.steps, args.warmup, args.child == "rl", args.ops)
        print("RESULT " + json.dumps(out))
        return
    cfg = config(args.overrides)
    data = Path(tempfile.mkdtemp()) / "rows.json"
    rows(args.overrides, max((args.steps + 1) * cfg.sft.batch_size, cfg.data.batch_size * cfg.algorithm.group_size), data)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"{cpu}; torch {torch.__version__}; {' '.join(args.overrides)}; {args.steps} steps an arm, the first "
          f"{args.warmup} untimed")
    arms = [("sft", "sft", [])] + [(name, "rl", o) for name, o in RL_ARMS]
    arms = [a for a in arms if not args.arms or a[0] in args.arms]
    print("| arm | rows a step | tokens a step (ran) | s / step | tokens / s | forwards (s) | backwards (s) | clip (s) | "
          "AdamW (s) |\n"
          "|---|---|---|---|---|---|---|---|---|")
    tables = []
    for name, kind, overrides in arms:
        proc = subprocess.run([sys.executable, __file__, "--child", kind, "--data", str(data), "--steps",
                               str(args.steps), "--warmup", str(args.warmup), "--ops", str(args.ops),
                               *args.overrides, *overrides], capture_output=True, text=True)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"| {name} | failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]} |")
            continue
        r = json.loads(found[-1].removeprefix("RESULT "))
        s = r["seconds"]
        print(f"| {name} | {r['rows']} | {r['real_tokens']:.0f} ({r['ran_tokens']:.0f}) | {r['step_s']:.2f} | "
              f"{r['tokens_per_s']:.0f} | " + " | ".join(f"{s.get(k, 0.0):.2f}" for k in
                                                          ("forward", "backward", "clip", "adamw")) + " |", flush=True)
        if "ops" in r:
            tables.append((name, r["ops"]))
    for name, table in tables:
        print(f"\n{name}: the costliest ops of its last step\n{table}")


if __name__ == "__main__":
    main()
