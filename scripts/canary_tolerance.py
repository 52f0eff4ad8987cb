"""Measure what the weight-sync canary sees, per precision: the honest engine/learner difference
after real syncs, and the difference after one missed sync, one missed prefix-cache reset or one
corrupted weight; how the canary's exact checks (`rlvr.rollout.engine.Canary`: the digests of the
weights the engine holds against those sent, the prefix cache serving nothing after a sync, the
engine's logprobs moving when the learner's do) judge each fault and the honest syncs; and what the
digests cost per sync.

    python scripts/canary_tolerance.py                       # tiny and default model, fp32 and bf16-mixed
    python scripts/canary_tolerance.py --models tiny --updates 3

For each model and precision: the learner (float32 masters, bf16 autocast under bf16-mixed) and the
engine (float32 or bfloat16 weights) start from the same weights; each round takes one real update
on real rollouts of `+experiment=multiplication` (its learning rate), then measures the canary with
the update held back from the engine (a missed sync), then syncs and measures it again (honest). A
tolerance means something only where every honest difference is below every faulty one; the
exact checks must catch every fault and flag no honest sync.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    from rlvr.learner.precision import resolve
    from rlvr.prompts import render
    from rlvr.rewards import Rewards
    from rlvr.rollout import fingerprint
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
    tok = learner.policy.tokenizer
    engine = VllmEngine(path, cfg.rollout, precision.engine_dtype, 0, "cpu", Path(cfg.cache_dir))
    dtype = precision.engine_torch_dtype
    prompt = render(tok, task.eval_prompts()[0])
    canary = canary_sequence(prompt, tok(" <answer>42</answer>", add_special_tokens=False).input_ids,
                             engine.block_size(), cfg.rollout.max_model_len)
    n = len(canary) - 1  # the sequence's own positions, the same tokens at every check

    def measure_now() -> tuple[float, torch.Tensor, torch.Tensor, int]:
        engine_lp, learner_lp, cached = canary_logprobs(engine, learner.scorer.sequence_logprobs, canary)
        return (engine_lp - learner_lp).abs().max().item(), engine_lp[:n], learner_lp[:n], cached

    def digests_differ(expected: dict[str, str], offset: int) -> bool:
        t0 = time.perf_counter()
        held = engine.weight_digests(offset)
        out["engine digest s"].append(time.perf_counter() - t0)
        return any(held.get(name) != expected[name] for name in covered)

    def learner_digests(offset: int) -> dict[str, str]:
        """The digests `Canary.watch` keeps of a sync (timed apart from the sync's own cast)."""
        weights = list(learner.policy.named_weights(dtype))
        t0 = time.perf_counter()
        sent = {name: fingerprint.digest(fingerprint.window(t, offset)) for name, t in weights}
        out["learner digest s"].append(time.perf_counter() - t0)
        return sent

    out = {k: [] for k in ("honest", "missed", "stale cache", "corrupted", "missed caught", "honest flagged",
                           "missed digest", "stale cache served", "corrupted digest", "honest digest flagged",
                           "engine digest s", "learner digest s")}
    last = measure_now()
    out["honest"].append(last[0])
    start, held = learner_digests(0), engine.weight_digests(0)
    covered = {name for name, d in start.items() if held.get(name) == d}  # what the Canary compares (its first check)
    out["covered"] = [len(covered), len(start)]
    def update(step: int) -> None:
        prompts = task.sample(cfg.data.batch_size)
        rollouts = engine.generate(prompts, [render(tok, p) for p in prompts], n=cfg.algorithm.group_size,
                                   seed=100 + step)
        rewards.score(rollouts)
        batch = make_batch(rollouts, learner.policy.pad_id)
        adv = advantages.compute(rewards.scores(rollouts, cfg.algorithm.group_size), "grpo", 1e-6)
        batch.advantages = adv.flatten() if adv.abs().sum() > 0 else torch.randn(len(batch))
        learner.step(batch)

    try:
        for step in range(updates):
            update(step)
            offset = step * fingerprint.WIDTH  # the window moves each sync, as in a run
            expected = learner_digests(offset)
            missed = measure_now()
            out["missed"].append(missed[0])
            out["missed caught"].append(float(learner_moved_alone(missed[1:3], last[1:3])))
            out["missed digest"].append(float(digests_differ(expected, offset)))
            engine.load_weights(learner.policy.named_weights(dtype))
            out["honest digest flagged"].append(float(digests_differ(expected, offset)))
            honest = measure_now()
            out["honest"].append(honest[0])
            out["honest flagged"].append(float(learner_moved_alone(honest[1:3], last[1:3])))
            last = honest
        # one sync whose prefix-cache reset is skipped, after one more update
        update(updates)
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": learner.policy.named_weights(dtype),
                                                            "is_checkpoint_format": True})
        stale = measure_now()
        out["stale cache"].append(stale[0])
        out["stale cache served"].append(float(stale[3] > 0))
        engine.load_weights(learner.policy.named_weights(dtype))
        # one corrupted weight: a single entry of the last MLP's down projection, off by 10 %
        name, weight = [(n, p) for n, p in learner.policy.model.named_parameters() if "down_proj" in n][-1]
        weights = dict(learner.policy.named_weights(dtype))
        bad = weights[name].clone()
        bad.view(-1)[0] *= 1.1
        weights[name] = bad
        engine.load_weights(weights.items())
        out["corrupted"].append(measure_now()[0])
        out["corrupted digest"].append(float(digests_differ(learner_digests(0), 0)))  # its column is in this window
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
            u = args.updates
            rows.append((model, precision, f"{max(r['honest']):.2g}", f"{min(r['missed']):.2g}",
                         f"{r['stale cache'][0]:.2g}", f"{r['corrupted'][0]:.2g}",
                         f"{sum(r['missed digest']):.0f}/{u}", f"{sum(r['stale cache served']):.0f}/1",
                         f"{sum(r['corrupted digest']):.0f}/1", f"{sum(r['missed caught']):.0f}/{u}",
                         f"{sum(r['honest digest flagged']) + sum(r['honest flagged']):.0f}/{u}",
                         f"{max(r['learner digest s']):.2f} + {max(r['engine digest s']):.2f}",
                         f"{r['covered'][0]}/{r['covered'][1]}"))
            print(model, precision, {k: [f"{x:.2g}" for x in v] for k, v in r.items()}, flush=True)
    print("\n| model | precision | honest diff (max) | one missed sync (min) | one missed cache reset | one corrupted "
          "weight | missed syncs caught by digest | missed reset caught | corruption caught by digest | missed "
          "syncs caught bit-for-bit | honest syncs flagged | digest s (learner + engine) | tensors compared |")
    print("|" + "---|" * 13)
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
