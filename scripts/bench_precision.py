"""Benchmark fp32, bf16-mixed and LoRA on this machine, side by side in one run, on the same work.

    python scripts/bench_precision.py                          # the default model
    python scripts/bench_precision.py --repeats 2 model=tiny
    python scripts/bench_precision.py --no-lora                # fp32 and bf16-mixed (compiled or not) only
    python scripts/bench_precision.py data.batch_size=8        # 8 prompts x 8 samples (issue 11's settings)

First the matmul rate this machine reaches in float32 and in bfloat16 on a model-shaped product
([4800 x 576] . [576 x 1536], SmolLM2's MLP). Then one step's rollouts of
`+experiment=multiplication` are generated once (float32 engine) with random non-zero advantages, so
that every sequence is trained on; and each variant -- `learner.precision=fp32`, `=bf16-mixed` (its
decoder layers compiled, as `learner.compile=auto` does there, and not), and each with LoRA
(`model.lora.r=16`) -- runs in its own process (for its own peak memory) what one RL
step runs: its engine (in the variant's dtype) samples from the same prompts with the same seeds as
many tokens as the saved batch's completions have, each sequence its own count, eos ignored (one
warm-up call first), its learner takes `--warmup` untimed updates (a run's first two pay once for
AdamW's state, for the heap growing to its peak and for compiling: 1.5-4x a later one) and then `--repeats` timed
ones on exactly the saved batch (with the variant's defaults: TIS under bf16-mixed), each update is
synced into the engine, and the canary checks it. Printed per variant: a step (rollout + update +
sync, means), its split, rollout tokens/s, the learner's time per token through the model, its
throughput (6 x parameters x tokens per second, a floating-point estimate; LoRA skips the base
weights' gradients, about a third of that, so its share reads high) as a share of the measured
matmul rate of its dtype, the canary difference, and peak resident memory. Speed is measured here,
never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed


def matmul_gflops(dtype: torch.dtype, seconds: float = 2.0) -> float:
    a, b = torch.randn(4800, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    a @ b  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * 4800 * 576 * 1536 * n / (time.perf_counter() - start) / 1e9


# label -> (precision, overrides)
VARIANTS = {
    "fp32": ("fp32", []),
    "bf16-mixed": ("bf16-mixed", []),
    "bf16-mixed, not compiled": ("bf16-mixed", ["learner.compile=false"]),  # the lever of learner.compile
    "fp32 + LoRA r16": ("fp32", ["model.lora.r=16"]),
    "bf16-mixed + LoRA r16": ("bf16-mixed", ["model.lora.r=16"]),
}


def config(overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose(config_name="train", overrides=["+experiment=multiplication", *overrides]))


def setup(cfg):
    """The model folder, its tokenizer, the step's prompts (the task's first draw for cfg.seed) and
    their ids."""
    from transformers import AutoTokenizer

    from rlvr import models
    from rlvr.data import build_task
    from rlvr.prompts import render

    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    tok = AutoTokenizer.from_pretrained(path)
    prompts = build_task(cfg, path).sample(cfg.data.batch_size)
    return path, tok, prompts, [render(tok, p) for p in prompts]


def generate(overrides: list[str], out: Path) -> None:
    """One step's rollouts (float32 engine), with random non-zero advantages, saved as a Batch."""
    from rlvr.learner import make_batch
    from rlvr.rollout.vllm_engine import VllmEngine

    cfg = config(overrides)
    path, tok, prompts, ids = setup(cfg)
    engine = VllmEngine(path, cfg.rollout, "float32", cfg.seed, "cpu", Path(cfg.cache_dir))
    try:
        rollouts = engine.generate(prompts, ids, n=cfg.algorithm.group_size, seed=1)
    finally:
        engine.close()
    batch = make_batch(rollouts, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    batch.advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
    torch.save({k: getattr(batch, k) for k in batch.__dataclass_fields__}, out)


def fixed_rollout(engine, batch, rollout, seed: int) -> int:
    """The engine samples, after each sequence's prompt in `batch`, exactly as many tokens as that
    sequence's completion there (at the run's temperature and top-p, eos ignored, sample i seeded with
    `seed` + i): the same work for every variant, with the lengths of a real step. Sampled freely, the
    lengths follow each variant's weights, which its updates move differently: in one run the bf16-mixed
    variant sampled 14 % more tokens than the fp32 one. Returns the tokens sampled."""
    from vllm import SamplingParams

    lens = (batch.attention_mask.sum(dim=1) - batch.prompt_lens).tolist()
    prompts = zip(batch.input_ids, batch.prompt_lens.tolist(), strict=True)
    requests = [{"prompt_token_ids": row[:p].tolist()} for row, p in prompts]
    params = [SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, max_tokens=n, ignore_eos=True,
                             logprobs=0, seed=seed + i) for i, n in enumerate(lens)]
    outputs = engine.llm.generate(requests, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs)


def child(precision_name: str, overrides: list[str], batch_file: Path, repeats: int, warmup: int) -> dict:
    from rlvr.host import keep_freed_memory
    from rlvr.learner import Learner
    from rlvr.learner.precision import resolve
    from rlvr.records import Batch
    from rlvr.rollout.engine import Canary, canary_sequence
    from rlvr.rollout.vllm_engine import VllmEngine

    keep_freed_memory()  # as `rlvr train` does
    cfg = config([f"learner.precision={precision_name}", *overrides])
    precision = resolve(cfg.learner.precision, cfg.rollout.dtype, cfg.rollout.canary_tol, "cpu")
    path, tok, _, ids = setup(cfg)  # the prompts to sample come from the saved batch (fixed_rollout)
    lora = cfg.model.lora if cfg.model.lora.r > 0 else None
    learner = Learner(path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature, cfg.rollout.max_tokens,
                      "cpu", precision, lora=lora)
    engine = VllmEngine(path, cfg.rollout, precision.engine_dtype, cfg.seed, "cpu", Path(cfg.cache_dir))
    dtype = precision.engine_torch_dtype
    answer = tok(" <answer>42</answer>", add_special_tokens=False).input_ids
    canary = Canary(canary_sequence(min(ids, key=len), answer, engine.block_size(), cfg.rollout.max_model_len),
                    precision.canary_tol)
    batch = Batch(**torch.load(batch_file))
    warmup_s: list[float] = []
    try:
        fixed_rollout(engine, batch, cfg.rollout, seed=0)  # warm-up
        for _ in range(warmup):  # one-time costs: AdamW's state, the heap growing to its peak
            t0 = time.perf_counter()
            learner.step(batch)
            warmup_s.append(time.perf_counter() - t0)
            engine.load_weights(learner.policy.named_weights(dtype))
        canary.check(engine, learner.scorer.sequence_logprobs)
        out = {k: [] for k in ("rollout_s", "tokens", "learn_s", "learn_tokens", "sync_s", "canary")}
        for r in range(repeats):
            t0 = time.perf_counter()
            tokens = fixed_rollout(engine, batch, cfg.rollout, seed=1000 * (1 + r))
            out["rollout_s"].append(time.perf_counter() - t0)
            out["tokens"].append(tokens)
            t0 = time.perf_counter()
            stats = learner.step(batch)
            out["learn_s"].append(time.perf_counter() - t0)
            out["learn_tokens"].append(stats["learn/tokens"])
            t0 = time.perf_counter()
            engine.load_weights(learner.policy.named_weights(dtype))
            out["sync_s"].append(time.perf_counter() - t0)
            out["canary"].append(canary.check(engine, learner.scorer.sequence_logprobs))
    finally:
        engine.close()
    mean = {k: statistics.mean(v) for k, v in out.items()}
    mean["canary"] = max(out["canary"])
    mean["warmup_s"] = warmup_s
    mean["params"] = sum(p.numel() for n, p in learner.policy.model.named_parameters() if "lora_" not in n)
    mean["sequences"] = len(batch)
    mean["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return mean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="steps per variant (rollout, update, sync)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed updates first (their times are printed): one-time costs a run pays once")
    parser.add_argument("--no-lora", action="store_true", help="skip the LoRA variants")
    parser.add_argument("--child", nargs=2, metavar=("PRECISION", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--generate", metavar="BATCH", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides, e.g. model=tiny")
    args = parser.parse_args()
    if args.generate:
        generate(args.overrides, Path(args.generate))
        return 0
    if args.child:
        precision, batch_file = args.child
        print(json.dumps(child(precision, args.overrides, Path(batch_file), args.repeats, args.warmup)))
        return 0

    from rlvr.learner.precision import cpu_bf16_flags

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    rates = {"fp32": matmul_gflops(torch.float32), "bf16-mixed": matmul_gflops(torch.bfloat16)}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        batch_file = Path(tmp) / "batch.pt"
        # in a process of its own: a parent that had run (and closed) an engine was seen at ~14 % CPU
        # while the variants ran
        subprocess.run([sys.executable, __file__, "--generate", str(batch_file), *args.overrides], check=True,
                       capture_output=True)
        for label, (precision, extra) in VARIANTS.items():
            if args.no_lora and "model.lora.r=16" in extra:
                continue
            out = subprocess.run([sys.executable, __file__, "--child", precision, str(batch_file), "--repeats",
                                  str(args.repeats), "--warmup", str(args.warmup), *args.overrides, *extra],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            r = results[label] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{label}: {r['rollout_s'] + r['learn_s'] + r['sync_s']:.1f} s a step (warm-up updates: "
                  f"{', '.join(f'{t:.1f}' for t in r['warmup_s']) or 'none'} s)", file=sys.stderr, flush=True)
    base = results["fp32"]
    base_step = base["rollout_s"] + base["learn_s"] + base["sync_s"]
    print(f"\nCPU: {cpu}; bf16 units: {', '.join(cpu_bf16_flags()) or 'none'}; {torch.get_num_threads()} threads; "
          f"matmul fp32 {rates['fp32']:.0f} GFLOP/s, bf16 {rates['bf16-mixed']:.0f} GFLOP/s; every variant: the same "
          f"{base['sequences']} sequences to learn on and as many tokens to sample, mean of {args.repeats} steps")
    print("| variant | step s (× fp32) | rollout s | update s | sync s | rollout tok/s | learner tokens | learner ms/token "
          "| learner GFLOP/s (share of matmul) | canary diff | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        precision = VARIANTS[label][0]
        step = r["rollout_s"] + r["learn_s"] + r["sync_s"]
        learner = 6 * r["params"] * r["learn_tokens"] / r["learn_s"] / 1e9
        print(f"| {label} | {step:.1f} ({step / base_step:.2f}) | {r['rollout_s']:.1f} | {r['learn_s']:.1f} | "
              f"{r['sync_s']:.2f} | {r['tokens'] / r['rollout_s']:.0f} | {r['learn_tokens']:.0f} | "
              f"{1000 * r['learn_s'] / r['learn_tokens']:.1f} | {learner:.0f} ({learner / rates[precision]:.0%}) | "
              f"{r['canary']:.2g} | {r['peak_rss_gib']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
