"""Benchmark the shared-prefix learner against full rows on the same rollouts, side by side.

    python scripts/bench_shared_prefix.py                          # multiplication and function picking
    python scripts/bench_shared_prefix.py --experiments multiplication --repeats 3 model=tiny

For each experiment, one engine generates one step's rollouts with the default model (the
experiment's prompts per step and group size); then, each in a fresh process so that its peak
memory is its own, the learner takes its update on exactly that batch with `learner.shared_prefix`
false and true, `--repeats` times. Printed: learner seconds per update (mean and min), tokens
through the model per update, peak resident memory of the process, and the largest logprob
difference between the two. Speed is measured here, never asserted in tests.
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


def config(experiment: str, overrides: list[str]):
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return typed(compose(config_name="train", overrides=[f"+experiment={experiment}", *overrides]))


def generate(experiment: str, overrides: list[str], out: Path) -> None:
    """One step's rollouts of the experiment, as a Batch saved to `out`."""
    from rlvr import models
    from rlvr.data import build_task
    from rlvr.learner import make_batch
    from rlvr.prompts import render
    from rlvr.rollout.vllm_engine import VllmEngine

    cfg = config(experiment, overrides)
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    task = build_task(cfg, path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    prompts = task.sample(cfg.data.batch_size)
    engine = VllmEngine(path, cfg.rollout, "float32", cfg.seed, "cpu", Path(cfg.cache_dir))
    try:
        rollouts = engine.generate(prompts, [render(tok, p) for p in prompts], n=cfg.algorithm.group_size, seed=1)
    finally:
        engine.close()
    batch = make_batch(rollouts, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    g = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(len(batch), generator=g)  # every row runs, as in a step with signal
    torch.save({k: getattr(batch, k) for k in batch.__dataclass_fields__}, out)


def learn(experiment: str, overrides: list[str], batch_file: Path, shared: bool, repeats: int) -> dict:
    """The learner's update on the saved batch, `repeats` times (fresh weights each time is not needed:
    the time of an update does not depend on the weights)."""
    from rlvr import models
    from rlvr.learner import Learner
    from rlvr.records import Batch

    cfg = config(experiment, [*overrides, f"learner.shared_prefix={str(shared).lower()}"])
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    learner = Learner(path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                      cfg.rollout.max_tokens, "cpu")
    batch = Batch(**torch.load(batch_file))
    logprobs = learner.scorer.batch_logprobs(batch)
    times, tokens = [], 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        stats = learner.step(batch)
        times.append(time.perf_counter() - t0)
        tokens = stats["learn/tokens"]
    return {"times": times, "tokens": tokens, "sequences": len(batch),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "logprobs": (logprobs * batch.loss_mask).tolist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", default="multiplication,function_picking")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("EXPERIMENT", "BATCH", "SHARED"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="rlvr train overrides, e.g. model=tiny")
    args = parser.parse_args()
    if args.child:
        experiment, batch_file, shared = args.child
        print(json.dumps(learn(experiment, args.overrides, Path(batch_file), shared == "true", args.repeats)))
        return 0

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for experiment in args.experiments.split(","):
            batch_file = Path(tmp) / f"{experiment}.pt"
            generate(experiment, args.overrides, batch_file)
            results = {}
            for shared in ("false", "true"):
                out = subprocess.run([sys.executable, __file__, "--child", experiment, str(batch_file), shared,
                                      "--repeats", str(args.repeats), *args.overrides],
                                     capture_output=True, text=True, check=True)
                results[shared] = json.loads(out.stdout.strip().splitlines()[-1])
            diff = (torch.tensor(results["false"]["logprobs"]) - torch.tensor(results["true"]["logprobs"])).abs().max()
            for shared, r in results.items():
                rows.append((experiment, "shared prefix" if shared == "true" else "full rows", r["sequences"],
                             statistics.mean(r["times"]), min(r["times"]), r["tokens"], r["peak_rss_gib"], float(diff)))
    print(f"\nCPU: {cpu}, {torch.get_num_threads()} threads; {args.repeats} updates each, on the same rollouts")
    print("| experiment | learner | sequences | update s (mean) | update s (min) | tokens through the model "
          "| peak RSS GiB | max logprob diff |")
    print("|---|---|---|---|---|---|---|---|")
    for e, v, n, mean, low, tokens, rss, diff in rows:
        print(f"| {e} | {v} | {n} | {mean:.2f} | {low:.2f} | {tokens:,.0f} | {rss:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
