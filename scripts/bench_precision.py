"""Benchmark fp32 against bf16-mixed on this machine, side by side in one run.

    python scripts/bench_precision.py                          # the default model, 4 steps each
    python scripts/bench_precision.py --steps 3 model=tiny

First the matmul rate this machine reaches in float32 and in bfloat16 on a model-shaped product
([4800 x 576] . [576 x 1536], SmolLM2's MLP); then `+experiment=multiplication` runs `--steps` steps
under `trainer.precision=fp32` and `=bf16-mixed`, each in its own process (for its peak memory).
Printed per precision: the step time and its split (mean of the steps after the first), rollout
tokens/s, the learner's throughput (6 x parameters x tokens through the model per second, a
floating-point estimate) as a share of the measured matmul rate of its dtype, the canary
difference, and peak resident memory. Speed is measured here, never asserted in tests.
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


def matmul_gflops(dtype: torch.dtype, seconds: float = 2.0) -> float:
    a, b = torch.randn(4800, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    a @ b  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    return 2 * 4800 * 576 * 1536 * n / (time.perf_counter() - start) / 1e9


def child(precision: str, steps: int, overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from safetensors import safe_open

    from rlvr import models
    from rlvr.cli import CONFIG_DIR
    from rlvr.config import register
    from rlvr.train import train

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "+experiment=multiplication", f"trainer.max_steps={steps}", "trainer.save_model=false",
            "trainer.log_samples=0", "trainer.eval_every=0", "data.eval_size=4", f"trainer.precision={precision}",
            *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp))
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    params = 0  # stored once each (tied embeddings count once)
    for file in models.resolve(cfg.model, Path(cfg.cache_dir)).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            params += sum(torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
    steps_ = [r for r in records if "time/step_s" in r]
    rest = steps_[1:] or steps_
    mean = {k: statistics.mean(r[k] for r in rest) for k in
            ("time/step_s", "time/rollout_s", "time/learn_s", "time/sync_s", "tokens_per_s", "learn/tokens",
             "sync/logprob_max_diff")}
    mean["params"] = params
    mean["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return mean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides, e.g. model=tiny")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.overrides)))
        return 0
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    from rlvr.precision import cpu_bf16_flags

    rates = {"fp32": matmul_gflops(torch.float32), "bf16-mixed": matmul_gflops(torch.bfloat16)}
    results = {}
    for precision in ("fp32", "bf16-mixed"):
        out = subprocess.run([sys.executable, __file__, "--child", precision, "--steps", str(args.steps),
                              *args.overrides], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        results[precision] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nCPU: {cpu}; bf16 units: {', '.join(cpu_bf16_flags()) or 'none'}; {torch.get_num_threads()} threads; "
          f"matmul fp32 {rates['fp32']:.0f} GFLOP/s, bf16 {rates['bf16-mixed']:.0f} GFLOP/s; mean of steps 2-{args.steps}")
    print("| precision | step s | rollout s | learn s | sync s | rollout tok/s | learner GFLOP/s (share of matmul) "
          "| canary diff | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision, r in results.items():
        learner = 6 * r["params"] * r["learn/tokens"] / r["time/learn_s"] / 1e9
        print(f"| {precision} | {r['time/step_s']:.1f} | {r['time/rollout_s']:.1f} | {r['time/learn_s']:.1f} | "
              f"{r['time/sync_s']:.2f} | {r['tokens_per_s']:.0f} | {learner:.0f} ({learner / rates[precision]:.0%}) | "
              f"{r['sync/logprob_max_diff']:.2g} | {r['peak_rss_gib']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
