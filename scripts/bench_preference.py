"""Benchmark the preference stage's update (DPO on the learner's one update path), and TRL's DPOTrainer
on the same pairs, side by side in one run.

    python scripts/bench_preference.py                       # rlvr and TRL, bf16-mixed and fp32
    python scripts/bench_preference.py --steps 8 --pairs 16

The pairs are the experiment's own (default `+experiment=multiplication_4x2_sft`: the seed's 4 x 2
multiplication on the default model): each prompt's written-out demonstration is the chosen answer,
and the worked answer to the next problem (as long, and wrong for this prompt) the rejected one,
drawn once with a fixed seed and given to every variant in the same order, `--pairs` pairs a step.
Each variant runs in a fresh process for `--steps` steps; the first `--warmup` are not timed. Both
trainers run DPO (beta 0.1) with a frozen reference forwarded every step, no gradient checkpointing,
the whole batch in one optimizer step (rlvr in micro-batches of `learner.micro_batch_size` rows, with
each pair's prompt forwarded once: `learner.shared_prefix`). Printed per variant: seconds per step,
tokens per second (each pair's real tokens: the prompt with the chosen answer and the prompt with the
rejected one, no padding; what each trainer is given) and peak resident memory. TRL is not a dependency
of rlvr: when it does not import, it is installed with `pip install --no-deps --target` into the cache
(`RLVR_CACHE`, default ~/.cache/rlvr) so that nothing rlvr pins changes. Speed is measured here,
never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed

EXPERIMENT = "+experiment=multiplication_4x2_sft"
TRL = "trl==1.16.0"


def config(overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose(config_name="train", overrides=overrides))


def pairs(overrides: list[str], n: int, out: Path) -> None:
    """`n` pairs as token ids and as TRL's conversational rows, into `out` (JSON)."""
    from transformers import AutoTokenizer

    from rlvr import models
    from rlvr.data import build_task
    from rlvr.records import Demonstration
    from rlvr.rollout.multiturn import build_tools
    from rlvr.sft import Demonstrations, encode

    cfg = config(overrides)
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    tok, tools = AutoTokenizer.from_pretrained(path), build_tools(cfg.tools, cfg.rollout)
    drawn = Demonstrations(build_task(cfg, path), cfg, tok, tools).next(n + 1)
    rows = []
    for chosen, other in zip(drawn, drawn[1:], strict=False):
        rejected = encode(tok, tools, [Demonstration(chosen.prompt, other.conversation)], cfg.rollout.max_model_len)[0]
        rows.append({"prompt_ids": chosen.prompt_ids, "chosen_ids": chosen.completion_ids,
                     "rejected_ids": rejected.completion_ids, "prompt": chosen.prompt.messages,
                     "chosen": chosen.conversation, "rejected": other.conversation})
    out.write_text(json.dumps({"model": str(path), "rows": rows}))


def _tokens(row: dict) -> int:
    return 2 * len(row["prompt_ids"]) + len(row["chosen_ids"]) + len(row["rejected_ids"])


def rlvr_variant(overrides: list[str], data: Path, steps: int, warmup: int, n: int) -> dict:
    from rlvr.algorithms.objective import Preference, PreferenceConfig
    from rlvr.learner import Learner, make_batch
    from rlvr.learner.precision import resolve
    from rlvr.records import Prompt, Rollout

    cfg = config(overrides)
    blob = json.loads(data.read_text())
    precision = resolve(cfg.learner.precision, cfg.rollout.dtype, None, "cpu")
    learner = Learner(Path(blob["model"]), cfg.optim, cfg.algorithm, cfg.learner, 1.0, cfg.rollout.max_tokens, "cpu",
                      precision, schedule=cfg.schedule("dpo"), with_reference=True)
    objective = Preference(PreferenceConfig("dpo", 0.1))
    times, tokens = [], []
    for step in range(steps):
        part = blob["rows"][step * n : (step + 1) * n]
        rows = [Rollout(Prompt([], ""), k, r["prompt_ids"], r[side], [0.0] * len(r[side]), "", "stop")
                for k, r in enumerate(part) for side in ("chosen_ids", "rejected_ids")]
        t0 = time.perf_counter()
        learner.step(make_batch(rows, learner.policy.pad_id), objective)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(sum(_tokens(r) for r in part))
    return {"step_s": sum(times) / len(times), "tokens_per_s": sum(tokens) / sum(times)}


def trl_variant(data: Path, steps: int, warmup: int, n: int, bf16: bool) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    blob = json.loads(data.read_text())
    tok = AutoTokenizer.from_pretrained(blob["model"])
    model = AutoModelForCausalLM.from_pretrained(blob["model"], dtype=torch.float32)
    rows = blob["rows"][: steps * n]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                                 for r in rows])
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    args = DPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=n, max_steps=steps, learning_rate=1e-6,
                     beta=0.1, bf16=bf16, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1000,
                     dataloader_num_workers=0, gradient_checkpointing=False)
    trainer = DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok, callbacks=[Clock()])
    trainer.train()
    timed = times[warmup:]
    # (the trainer's sampler shuffles: every step's pairs are of like length, so the mean per step is used)
    per_step = sum(_tokens(r) for r in rows) / steps
    return {"step_s": sum(timed) / len(timed), "tokens_per_s": per_step * len(timed) / sum(timed)}


def trl_path() -> Path | None:
    """Where TRL imports from: already importable (None), or installed without its dependencies into the cache."""
    try:
        import trl  # noqa: F401

        return None
    except ImportError:
        pass
    target = Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr")) / TRL.replace("==", "-")
    if not (target / "trl").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), TRL],
                       check=True)
    return target


def child(args) -> None:
    if args.trl:
        out = trl_variant(Path(args.data), args.steps, args.warmup, args.pairs, args.bf16)
    else:
        out = rlvr_variant(args.overrides, Path(args.data), args.steps, args.warmup, args.pairs)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per variant (default 6)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps not timed (default 2)")
    parser.add_argument("--pairs", type=int, default=16, help="pairs per step (default 16)")
    parser.add_argument("--no-trl", action="store_true", help="rlvr's variants only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides (default: +experiment=multiplication_4x2_sft)")
    args = parser.parse_args()
    if not any(o.startswith("+experiment=") for o in args.overrides):
        args.overrides = [EXPERIMENT, *args.overrides]
    if args.child:
        return child(args)
    cfg = config(args.overrides)
    data = Path(tempfile.mkdtemp()) / "pairs.json"
    pairs(args.overrides, args.steps * args.pairs, data)
    lengths = [_tokens(r) / 2 for r in json.loads(data.read_text())["rows"]]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"{cpu}; torch {torch.__version__}; {' '.join(args.overrides)}; {args.pairs} pairs a step, sequences of "
          f"{sum(lengths) / len(lengths):.0f} tokens on average; micro-batches of {cfg.learner.micro_batch_size} rows "
          f"(rlvr); {args.steps} steps, the first {args.warmup} untimed")
    variants = [(f"rlvr DPO, {p}", [f"learner.precision={p}"], [], None) for p in ("bf16-mixed", "fp32")]
    if not args.no_trl:
        where = trl_path()
        variants += [(f"TRL {TRL} DPOTrainer, {'bf16' if b else 'fp32'}", [], ["--trl", *(["--bf16"] if b else [])],
                      where) for b in (True, False)]
    print("| trainer | s / step | tokens / s | peak RSS |\n|---|---|---|---|")
    for name, overrides, flags, path in variants:
        env = {**os.environ, **({"PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
                                if path else {})}
        proc = subprocess.run([sys.executable, __file__, "--child", "--data", str(data), "--steps", str(args.steps),
                               "--warmup", str(args.warmup), "--pairs", str(args.pairs), *flags, *args.overrides,
                               *overrides], capture_output=True, text=True, env=env)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"| {name} | failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]} | | |")
            continue
        r = json.loads(found[-1].removeprefix("RESULT "))
        print(f"| {name} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_rss_gib']:.1f} GiB |", flush=True)


if __name__ == "__main__":
    main()
