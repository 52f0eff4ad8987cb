"""The CUDA path of rlvr, checked: the whole `rlvr train` loop with the transformers rollout backend
on the tiny model and on random-weight ~0.5B and ~1.5B models built locally (no download), in fp32,
bf16-mixed (one case through `learner.precision=auto`, which must pick it on CUDA) and LoRA; prints
one Markdown table. Run it through `scripts/gpu_check.sh`.

    python scripts/gpu_check.py                     # on CUDA, every case (5 minutes on one H200)
    python scripts/gpu_check.py --device cpu --cases tiny-fp32 --steps 2   # a smoke test without a GPU
    python scripts/gpu_check.py --cases 0.5b-fp32,0.5b-auto data.batch_size=64 learner.micro_batch_size=64
                                                    # rlvr train overrides, after the case's own

Each case runs `--steps` steps of +experiment=multiplication with reward=digits (8 prompts x 8
samples, 48 new tokens) in its own process (its own peak memory), and its row, the mean of the steps
after the first, is printed as soon as it ends; cases that would start after `--budget` seconds are
skipped, so a run cut short still reports what it did. Columns: step time and its split, rollout
tokens/s, learner tokens/s and the learner's model FLOP/s as a share of the bf16 (or fp32) matmul
rate measured here on the same device (FLOPs per token: 6N with every weight training, 4N with LoRA;
N = parameters; TIS takes its old logprobs from the update's own forward), weight sync time, the
canary difference, and peak memory (CUDA: torch's peak allocation; CPU: the process's RSS).
Not in the table: FSDP2 (it needs two GPUs) and vLLM (the machine this was made for has none; the
train loop across processes needs it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CASES = {  # name: (model option, learner.precision, model.lora.r)
    "tiny-fp32": ("tiny", "fp32", 0),
    "tiny-bf16": ("tiny", "bf16-mixed", 0),
    "0.5b-fp32": ("random_0.5b", "fp32", 0),
    "0.5b-auto": ("random_0.5b", "auto", 0),
    "0.5b-bf16-lora": ("random_0.5b", "bf16-mixed", 16),
    "1.5b-bf16": ("random_1.5b", "bf16-mixed", 0),
    "1.5b-bf16-lora": ("random_1.5b", "bf16-mixed", 16),
}


def matmul_tflops(device: str, dtype: torch.dtype, seconds: float = 2.0) -> float:
    size = 8192 if device == "cuda" else 1024
    a, b = torch.randn(size, size, dtype=dtype, device=device), torch.randn(size, size, dtype=dtype, device=device)
    a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * n / (time.perf_counter() - start) / 1e12


def child(case: str, device: str, steps: int, overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir

    from rlvr import models
    from rlvr.cli import CONFIG_DIR
    from rlvr.config import register, typed
    from rlvr.train import train

    model, precision, lora = CASES[case]
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=[
            # reward=digits (the share of digits in the completion): random models get scores that differ
            # within a group, so every sequence goes through the learner
            "+experiment=multiplication", "reward=digits", f"model={model}", f"learner.precision={precision}", f"model.lora.r={lora}",
            "rollout.backend=transformers", f"launch.device={device}", "data.batch_size=8", "data.eval_size=8",
            f"trainer.max_steps={steps}", "trainer.save_model=false", "trainer.log_samples=0", "trainer.eval_every=0",
            *overrides]))
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    config = json.loads((path / "config.json").read_text())
    with torch.device("meta"):
        from transformers import AutoConfig, AutoModelForCausalLM

        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).parameters())
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp))
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        picked = json.loads((Path(tmp) / "manifest.json").read_text())["precision"]["learner"]
    timed = [r for r in records if "time/step_s" in r][1:]  # the first step warms up
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in timed[0] if isinstance(timed[0][k], int | float)}
    shown = precision if precision == picked else f"{precision}: {picked}"  # what `auto` picked
    return {**mean, "params": params, "model": model, "precision": picked, "shown": shown, "lora": lora}


HEADER = ("| model | params | precision | LoRA r | step s | rollout s | learn s | sync s | rollout tok/s "
          "| learner tok/s | learner share of matmul | canary diff | peak GiB |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: dict, rates: dict[str, float]) -> str:
    tokens_per_s = r["learn/tokens"] / r["time/learn_s"]
    flops = r["params"] * (4 if r["lora"] else 6)
    share = flops * tokens_per_s / (rates[r["precision"]] * 1e12)
    peak = r.get("memory/cuda_peak_gib", r["memory/rss_peak_gib"])
    return (f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['shown']} | {r['lora']} | {r['time/step_s']:.2f} | "
            f"{r['time/rollout_s']:.2f} | {r['time/learn_s']:.2f} | {r['time/sync_s']:.3f} | {r['tokens_per_s']:.0f} "
            f"| {tokens_per_s:.0f} | {share:.1%} | {r['sync/logprob_max_diff']:.2g} | {peak:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=480, help="seconds; later cases are skipped")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides for every case, e.g. data.batch_size=64")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.device, args.steps, args.overrides)))
        return 0
    began = time.perf_counter()
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    rates = {"bf16-mixed": matmul_tflops(args.device, torch.bfloat16), "fp32": matmul_tflops(args.device, torch.float32)}
    print(f"{time.strftime('%Y-%m-%d')}, {name}, torch {torch.__version__}; matmul bf16 {rates['bf16-mixed']:.2f} "
          f"TFLOP/s, fp32 {rates['fp32']:.2f} TFLOP/s; mean of steps 2-{args.steps}"
          f"{'; overrides: ' + ' '.join(args.overrides) if args.overrides else ''}\n\n{HEADER}", flush=True)
    ok = True
    for case in args.cases.split(","):
        left = args.budget - (time.perf_counter() - began)
        if left < 20:
            print(f"| {case} | skipped: the {args.budget:.0f} s budget is spent |||||||||||", flush=True)
            ok = False
            continue
        start = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, __file__, "--child", case, "--device", args.device,
                                  "--steps", str(args.steps), *args.overrides], capture_output=True, text=True,
                                 timeout=left)
        except subprocess.TimeoutExpired:
            print(f"| {case} | stopped at the budget after {time.perf_counter() - start:.0f} s |||||||||||", flush=True)
            ok = False
            continue
        if out.returncode != 0:
            print(f"| {case} | FAILED after {time.perf_counter() - start:.0f} s |||||||||||\n{out.stderr[-2500:]}",
                  flush=True)
            ok = False
            continue
        print(row(json.loads(out.stdout.strip().splitlines()[-1]), rates) + f" <!-- {time.perf_counter() - start:.0f} s -->",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
