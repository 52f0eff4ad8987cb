"""Benchmark the cold start's update (`rlvr sft`'s learner), and TRL's SFTTrainer on the same rows.

    python scripts/bench_sft.py                                   # bf16-mixed and fp32, packing on and off
    python scripts/bench_sft.py --trl                             # and TRL's SFTTrainer, side by side
    python scripts/bench_sft.py --trl --trl-packing               # TRL with its padding-free packing too
    python scripts/bench_sft.py --steps 8 +experiment=multiplication_tool_sft

The rows are the experiment's own demonstrations (default `+experiment=multiplication_4x2_sft`: the
seed's 4 x 2 multiplication written out, on the default model), drawn once with a fixed seed and given
to every variant in the same order, `sft.batch_size` rows a step. Each variant runs in a fresh process
(its own peak memory, no compiled code shared) for `--steps` steps; the first `--warmup` steps
(compiling, first touches of memory) are not timed. Printed per variant: seconds per step, tokens per
second (the rows' real tokens, prompt and answer, no padding: what each trainer is given) and peak
resident memory. TRL (`pip install trl`; not a dependency of rlvr) trains on the same rows as chat
`messages` (its loss on every token: SmolLM2's template has no generation markers for TRL's
assistant-only loss; the compute is the same), the batch size and learning rate of rlvr's,
no gradient checkpointing (with `--trl-packing`, its padding-free packing too). Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rlvr.algorithms.objective import SFT
from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed

EXPERIMENT = "+experiment=multiplication_4x2_sft"


def config(overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose(config_name="train", overrides=overrides))


def rows(overrides: list[str], n: int, out: Path) -> None:
    """`n` demonstrations of the experiment as token ids and as chat messages, into `out` (JSON)."""
    from transformers import AutoTokenizer

    from rlvr import models
    from rlvr.data import build_task
    from rlvr.rollout.multiturn import build_tools
    from rlvr.sft import Demonstrations

    cfg = config(overrides)
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    demos = Demonstrations(build_task(cfg, path), cfg, AutoTokenizer.from_pretrained(path),
                           build_tools(cfg.tools, cfg.rollout))
    drawn = demos.next(n)
    out.write_text(json.dumps({"model": str(path), "rows": [
        {"prompt_ids": r.prompt_ids, "completion_ids": r.completion_ids, "mask": r.completion_mask,
         "messages": [*r.prompt.messages, *r.conversation]} for r in drawn]}))


def rlvr_variant(overrides: list[str], data: Path, steps: int, warmup: int) -> dict:
    from rlvr.learner import Learner, make_batch
    from rlvr.learner.precision import resolve
    from rlvr.records import Prompt, Rollout

    cfg = config(overrides)
    blob = json.loads(data.read_text())
    precision = resolve(cfg.learner.precision, cfg.rollout.dtype, None, "cpu")
    learner = Learner(Path(blob["model"]), cfg.optim, cfg.algorithm, cfg.learner, 1.0, cfg.rollout.max_tokens, "cpu",
                      precision, schedule=cfg.schedule("sft"), shared_prefix=cfg.sft.packing)
    demos = [Rollout(Prompt([], ""), k, r["prompt_ids"], r["completion_ids"], [0.0] * len(r["completion_ids"]), "",
                     "stop", completion_mask=r["mask"]) for k, r in enumerate(blob["rows"])]
    B = cfg.sft.batch_size
    times, tokens = [], []
    for step in range(steps):
        part = sorted(demos[step * B : (step + 1) * B], key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
        t0 = time.perf_counter()
        learner.step(make_batch(part, learner.policy.pad_id), SFT())
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(r.prompt_ids) + len(r.completion_ids) for r in part))
    return {"step_s": sum(times) / len(times), "tokens_per_s": sum(tokens) / sum(times)}


def trl_variant(overrides: list[str], data: Path, steps: int, warmup: int, bf16: bool, packing: bool) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    cfg = config(overrides)
    blob = json.loads(data.read_text())
    tok = AutoTokenizer.from_pretrained(blob["model"])
    model = AutoModelForCausalLM.from_pretrained(blob["model"], dtype=torch.float32)
    B = cfg.sft.batch_size
    dataset = Dataset.from_list([{"messages": r["messages"]} for r in blob["rows"][: steps * B]])
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    args = SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, max_steps=steps,
                     learning_rate=cfg.sft.lr, bf16=bf16, use_cpu=True, assistant_only_loss=False,
                     completion_only_loss=None, packing=packing, padding_free=packing, report_to=[],
                     save_strategy="no", logging_steps=1000, dataloader_num_workers=0, shuffle_dataset=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok, callbacks=[Clock()])
    trainer.train()
    tokens = [sum(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in blob["rows"][s * B : (s + 1) * B])
              for s in range(steps)]
    timed = times[warmup:]
    return {"step_s": sum(timed) / len(timed), "tokens_per_s": sum(tokens[warmup:steps]) / sum(timed)}


def child(args) -> None:
    if args.trl:
        out = trl_variant(args.overrides, Path(args.data), args.steps, args.warmup, args.bf16, args.packing)
    else:
        out = rlvr_variant(args.overrides, Path(args.data), args.steps, args.warmup)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per variant (default 6)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps not timed (default 2)")
    parser.add_argument("--trl", action="store_true", help="also TRL's SFTTrainer on the same rows")
    parser.add_argument("--trl-packing", action="store_true", help="TRL also with its padding-free packing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--packing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides (default: +experiment=multiplication_4x2_sft)")
    args = parser.parse_args()
    if not any(o.startswith("+experiment=") for o in args.overrides):
        args.overrides = [EXPERIMENT, *args.overrides]
    if args.child:
        return child(args)
    cfg = config(args.overrides)
    data = Path(tempfile.mkdtemp()) / "rows.json"
    rows(args.overrides, args.steps * cfg.sft.batch_size, data)
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in json.loads(data.read_text())["rows"]]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"{cpu}; torch {torch.__version__}; {' '.join(args.overrides)}; batch {cfg.sft.batch_size} rows of "
          f"{sum(lengths) / len(lengths):.0f} tokens (min {min(lengths)}, max {max(lengths)}); {args.steps} steps, "
          f"the first {args.warmup} untimed")
    variants = [(f"rlvr {p}, packing {'on' if k else 'off'}", [f"learner.precision={p}", f"sft.packing={k}"], [])
                for p in ("bf16-mixed", "fp32") for k in (True, False)]
    if args.trl:
        variants += [(f"TRL SFTTrainer {'bf16' if b else 'fp32'}, packing {'on' if k else 'off'}", [],
                      ["--trl", *(["--bf16"] if b else []), *(["--packing"] if k else [])])
                     for b in (True, False) for k in ((False, True) if args.trl_packing else (False,))]
    print("| trainer | s / step | tokens / s | peak RSS |\n|---|---|---|---|")
    for name, overrides, flags in variants:
        proc = subprocess.run([sys.executable, __file__, "--child", "--data", str(data), "--steps", str(args.steps),
                               "--warmup", str(args.warmup), *flags, *args.overrides, *overrides],
                              capture_output=True, text=True)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"| {name} | failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]} | | |")
            continue
        r = json.loads(found[-1].removeprefix("RESULT "))
        print(f"| {name} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_rss_gib']:.1f} GiB |", flush=True)


if __name__ == "__main__":
    main()
