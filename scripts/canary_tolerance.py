"""Measure what the weight-sync canary sees, per precision: the honest engine/learner difference
after real syncs, and the difference after one missed sync or one corrupted weight; and how the
canary's second check (`rlvr.rollout.engine.Canary`: the engine's logprobs must move when the
learner's do, bit for bit) judges the missed and the honest syncs.

    python scripts/canary_tolerance.py                       # tiny and default model, fp32 and bf16-mixed
    python scripts/canary_tolerance.py --models tiny --updates 3

For each model and precision: the learner (float32 masters, bf16 autocast under bf16-mixed) and the
engine (float32 or bfloat16 weights) start from the same weights; each round takes one real update
on real rollouts of `+experiment=multiplication` (its learning rate), then measures the canary with
the update held back from the engine (a missed sync), then syncs and measures it again (honest). A
tolerance means something only where every honest difference is below every faulty one; the
bit-for-bit check must catch every missed sync and flag no honest one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed


def measure(model: str, precision_name: str, updates: int) -> dict[str, list[float]]:
    from rlvr import models
    from rlvr.algorithms import advantages
    from rlvr.data import build_task
    from rlvr.learner import Learner, make_batch
    from rlvr.precision import resolve
    from rlvr.prompts import render
    from rlvr.rewards import Rewards
    from rlvr.rollout.engine import canary_logprobs, canary_sequence, learner_moved_alone
    from rlvr.rollout.vllm_engine import VllmEngine

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=["+experiment=multiplication", f"model={model}",
                                                      f"learner.precision={precision_name}"]))
    precision = resolve(cfg.learner.precision, cfg.rollout.dtype, cfg.rollout.canary_tol, "cpu")
    path = models.resolve(cfg.model, Path(cfg.cache_dir))
    task, rewards = build_task(cfg, path), Rewards(cfg.reward)
    learner = Learner(path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature, cfg.rollout.max_tokens,
                      "cpu", precision)
    tok = learner.tokenizer
    engine = VllmEngine(path, cfg.rollout, precision.engine_dtype, 0, "cpu", Path(cfg.cache_dir))
    dtype = getattr(torch, precision.engine_dtype)
    prompt = render(tok, task.eval_prompts()[0])
    canary = canary_sequence(prompt, tok(" <answer>42</answer>", add_special_tokens=False).input_ids,
                             engine.block_size(), cfg.rollout.max_model_len)
    n = len(canary) - 1  # the sequence's own positions, the same tokens at every check

    def measure_now() -> tuple[float, torch.Tensor, torch.Tensor]:
        engine_lp, learner_lp = canary_logprobs(engine, learner.sequence_logprobs, canary)
        return (engine_lp - learner_lp).abs().max().item(), engine_lp[:n], learner_lp[:n]

    last = measure_now()
    out = {"honest": [last[0]], "missed": [], "corrupted": [], "missed caught": [], "honest flagged": []}
    try:
        for step in range(updates):
            prompts = task.sample(cfg.data.batch_size)
            rollouts = engine.generate(prompts, [render(tok, p) for p in prompts], n=cfg.algorithm.group_size,
                                       seed=100 + step)
            rewards.score(rollouts)
            batch = make_batch(rollouts, learner.pad_id)
            adv = advantages.compute(rewards.scores(rollouts, cfg.algorithm.group_size), "grpo", 1e-6)
            batch.advantages = adv.flatten() if adv.abs().sum() > 0 else torch.randn(len(batch))
            learner.step(batch)
            missed = measure_now()
            out["missed"].append(missed[0])
            out["missed caught"].append(float(learner_moved_alone(missed[1:], last[1:])))
            engine.load_weights(learner.named_weights(dtype))
            honest = measure_now()
            out["honest"].append(honest[0])
            out["honest flagged"].append(float(learner_moved_alone(honest[1:], last[1:])))
            last = honest
        # one corrupted weight: a single entry of the last MLP's down projection, off by 10 %
        name, weight = [(n, p) for n, p in learner.model.named_parameters() if "down_proj" in n][-1]
        weights = dict(learner.named_weights(dtype))
        bad = weights[name].clone()
        bad.view(-1)[0] *= 1.1
        weights[name] = bad
        engine.load_weights(weights.items())
        out["corrupted"].append(measure_now()[0])
    finally:
        engine.close()
        rewards.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    parser.add_argument("--updates", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            r = measure(model, precision, args.updates)
            rows.append((model, precision, max(r["honest"]), min(r["missed"]), r["corrupted"][0],
                         f"{sum(r['missed caught']):.0f}/{args.updates}", f"{sum(r['honest flagged']):.0f}/{args.updates}"))
            print(model, precision, {k: [f"{x:.2g}" for x in v] for k, v in r.items()}, flush=True)
    print("\n| model | precision | honest diff (max) | one missed sync (min) | one corrupted weight "
          "| missed syncs caught bit-for-bit | honest syncs flagged |")
    print("|---|---|---|---|---|---|---|")
    for model, precision, honest, missed, corrupted, caught, flagged in rows:
        print(f"| {model} | {precision} | {honest:.2g} | {missed:.2g} | {corrupted:.2g} | {caught} | {flagged} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
