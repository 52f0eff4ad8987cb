"""What a bf16 engine's canary logprobs show of weights corrupted on the learner's side before their
digest is taken (a wrong name map, merge or cast: the engine then holds exactly what was sent, so the
digests agree), against an honest sync, per model family.

    python scripts/export_faults.py                          # every tiny family and the default model
    python scripts/export_faults.py --models qwen3,gemma2

For each model: a bf16-mixed learner and a bfloat16 engine start from the same weights; one real
update (rollouts of `+experiment=multiplication`, advantages ±1) is synced honestly, then each fault is
sent in its place. Printed per case, over the canary's positions: the largest |engine - learner|
difference (what `rollout.canary_tol` bounds), the mean, the share of positions off by more than 0.5
nats; and a second reference: the mean difference between the learner's own bf16 (autocast) and
float32 logprobs of the same tokens, and the ratio of the engine's mean difference to it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def faults(weights: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Corrupted copies of `weights`, each as one export fault would send them."""
    names = list(weights)
    mlp = [n for n in names if n.endswith(("down_proj.weight",))]
    attn = [n for n in names if n.endswith(("o_proj.weight", "dense.weight"))]
    out = {}
    a, b = mlp[0], mlp[-1]  # layer 0's and the last layer's: a map that mixes up layer numbers
    out["layers swapped (down_proj)"] = {**weights, a: weights[b], b: weights[a]}
    out["o_proj x2 (a merge scale)"] = {**weights, attn[0]: weights[attn[0]] * 2}
    out["o_proj transposed"] = ({**weights, attn[0]: weights[attn[0]].t().contiguous()}
                                if weights[attn[0]].shape[0] == weights[attn[0]].shape[1] else None)
    out["down_proj zeroed (a lost cast)"] = {**weights, a: torch.zeros_like(weights[a])}
    return {k: v for k, v in out.items() if v is not None}


def measure(path: Path, cache: Path) -> dict[str, tuple[float, float, float]]:
    from hydra import compose, initialize_config_dir

    from rlvr.cli import CONFIG_DIR
    from rlvr.config import register, typed
    from rlvr.learner import Learner, make_batch
    from rlvr.learner.precision import resolve
    from rlvr.prompts import render
    from rlvr.records import Prompt
    from rlvr.rollout.engine import canary_logprobs, canary_sequence
    from rlvr.rollout.vllm_engine import VllmEngine

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed(compose(config_name="train", overrides=["+experiment=multiplication", "model=local",
                                                            f"model.path={path}", "learner.precision=bf16-mixed",
                                                            "rollout.dtype=bfloat16", f"cache_dir={cache}"]))
    precision = resolve("bf16-mixed", "bfloat16", None, "cpu")
    torch.manual_seed(0)
    learner = Learner(path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 32, "cpu", precision)
    tok = learner.policy.tokenizer
    engine = VllmEngine(path, cfg.rollout, "bfloat16", 0, "cpu", cache)
    prompts = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 17? Show your work."}], answer="")
               for a in (1234, 5678)]
    ids = [render(tok, p) for p in prompts]
    canary = canary_sequence(ids[0], tok(" <answer>20978</answer>", add_special_tokens=False).input_ids,
                             engine.block_size(), cfg.rollout.max_model_len)
    try:
        batch = make_batch(engine.generate(prompts, ids, n=4, seed=1), learner.policy.pad_id)
        batch.advantages = torch.tensor([1.0, -1.0] * 4)
        learner.step(batch)
        weights = dict(learner.policy.named_weights(torch.bfloat16))
        cases = {"honest": weights, **faults(weights)}
        out = {}
        seen = []

        def score(token_ids: list[int]) -> torch.Tensor:
            seen.append(token_ids)
            return learner.scorer.sequence_logprobs(token_ids)

        for name, sent in cases.items():
            engine.load_weights(sent.items())
            engine_lp, learner_lp, _ = canary_logprobs(engine, score, canary)
            reference = learner.scorer.sequence_logprobs(seen[-1], other_precision=True)  # the canary's own
            diff = (engine_lp - learner_lp).abs()
            noise = (reference - learner_lp).abs().mean().item()
            out[name] = (diff.max().item(), diff.mean().item(), (diff > 0.5).float().mean().item(), noise,
                         diff.mean().item() / noise)
        return out
    finally:
        engine.close()


def main() -> int:
    from rlvr.models import build_atomically
    from rlvr.models.tiny import FAMILIES, build, build_family

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(["llama", *FAMILIES, "smollm2"]))
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlvr")
    args = parser.parse_args()
    print("| model | case | largest diff | mean diff | positions > 0.5 | learner bf16 vs fp32, mean | ratio |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        if model == "smollm2":
            path = args.cache / "models" / "SmolLM2-135M-Instruct"
            if not path.exists():
                from rlvr.models.smollm2 import build as build_smollm2

                build_atomically(path, build_smollm2)
        else:
            path = args.cache / "models" / f"tiny-{model}"
            build_atomically(path, build if model == "llama" else lambda p, m=model: build_family(p, m))
        if model == "olmo2":
            continue  # (vLLM serves it only through its transformers backend)
        for case, (largest, mean, share, noise, ratio) in measure(path, args.cache).items():
            print(f"| {model} | {case} | {largest:.3g} | {mean:.3g} | {share:.2f} | {noise:.3g} | {ratio:.3g} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
