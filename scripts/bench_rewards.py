"""Benchmark reward scoring: time per call of each reward preset, in the training process and in
worker processes (`reward.workers`), on completions shaped like a model's.

    python scripts/bench_rewards.py [--rollouts 256] [--workers 2]

Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import random
import time

from hydra import compose, initialize_config_dir

from rlvr.cli import CONFIG_DIR
from rlvr.config import register, typed
from rlvr.data import build_task
from rlvr.records import Rollout
from rlvr.rewards import Rewards

COMPLETIONS = {
    "multiplication": ["<answer>{answer}</answer>", "So it is {answer}.", "Let me think... 12 * 3 = 36", ""],
    "function_picking": ["<answer>{name}</answer>", "I would call {name} for this.", '<answer>{answer}</answer>',
                         "The function is probably `get_time()`."],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    register()
    rng = random.Random(0)
    print(f"| reward preset | calls | in process, per call | {args.workers} workers, per call |")
    print("|---|---|---|---|")
    for experiment, reward in [("multiplication", "multiplication"), ("function_picking", "function_picking"),
                               ("multiplication", "math")]:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = typed(compose(config_name="train", overrides=[f"+experiment={experiment}", f"reward={reward}"]))
        prompts = build_task(cfg).sample(args.rollouts)
        rollouts = []
        for p in prompts:
            name = p.meta.get("function", "")
            text = rng.choice(COMPLETIONS[experiment]).format(answer=p.answer, name=name)
            rollouts.append(Rollout(prompt=p, group=0, prompt_ids=[], completion_ids=[], sampler_logprobs=[],
                                    text=text, finish_reason="stop"))
        times = []
        for workers in (0, args.workers):
            cfg.reward.workers = workers
            rewards = Rewards(cfg.reward)
            rewards.score(rollouts[:4])  # warm-up: imports, worker start
            t0 = time.perf_counter()
            rewards.score(rollouts)
            times.append((time.perf_counter() - t0) / (len(rollouts) * len(rewards.fns)))
            rewards.close()
        calls = len(rollouts) * len(cfg.reward.terms)
        print(f"| {reward} | {calls} | {times[0] * 1e6:.0f} µs | {times[1] * 1e6:.0f} µs |")


if __name__ == "__main__":
    main()
