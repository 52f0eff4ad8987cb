"""Benchmark the two rollout backends side by side: vLLM and transformers, one step's rollouts.

    python scripts/bench_backends.py                                    # default model, multiplication
    python scripts/bench_backends.py --repeats 5 rollout.max_tokens=128 data.batch_size=8

Each backend serves the experiment's model in float32 on the CPU and generates the same prompts
(`data.batch_size` prompts x `algorithm.group_size` samples, the experiment's temperature and
max_tokens) `--repeats` times after one warm-up call. Printed per backend: start-up seconds, seconds
per call (mean and min), completion tokens per call and tokens/s (from the mean). One process, one
backend after the other, so that both see the same machine state; speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed


def cpu_model() -> str:
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="multiplication")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default="vllm,transformers")
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides (e.g. data.batch_size=8)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from rlvr import models
    from rlvr.data import build_task
    from rlvr.prompts import render
    from rlvr.rollout.engine import build_engine

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=[f"+experiment={args.experiment}", "data.batch_size=8",
                                                      *args.overrides]))
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    tok = AutoTokenizer.from_pretrained(path)
    prompts = build_task(cfg, path).sample(cfg.data.batch_size)
    ids = [render(tok, p) for p in prompts]
    n = cfg.algorithm.group_size
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; model {path.name}, "
          f"{len(prompts)} prompts x {n} samples, temperature {cfg.rollout.temperature}, "
          f"max_tokens {cfg.rollout.max_tokens}, {args.repeats} calls after a warm-up\n", flush=True)
    rows = []
    for backend in args.backends.split(","):
        cfg.rollout.backend = backend
        start = time.perf_counter()
        engine = build_engine(path, cfg.rollout, "float32", cfg.seed, "cpu", Path(cfg.cache_dir))
        startup = time.perf_counter() - start
        try:
            engine.generate(prompts, ids, n=n, seed=0)  # warm-up
            times, tokens = [], []
            for r in range(args.repeats):
                start = time.perf_counter()
                rollouts = engine.generate(prompts, ids, n=n, seed=1 + r)
                times.append(time.perf_counter() - start)
                tokens.append(sum(len(x.completion_ids) for x in rollouts))
        finally:
            engine.close()
        mean = statistics.mean(times)
        rows.append((backend, startup, mean, min(times), statistics.mean(tokens), statistics.mean(tokens) / mean))
        print(f"{backend}: done", flush=True)
    print("\n| backend | start-up s | s per call (mean / min) | completion tokens per call | tokens/s |")
    print("|---|---|---|---|---|")
    for backend, startup, mean, best, tokens, rate in rows:
        print(f"| {backend} | {startup:.1f} | {mean:.2f} / {best:.2f} | {tokens:.0f} | {rate:.0f} |")
    if len(rows) == 2:
        print(f"\n{rows[0][0]} / {rows[1][0]} tokens/s: {rows[0][5] / rows[1][5]:.1f}x")


if __name__ == "__main__":
    main()
