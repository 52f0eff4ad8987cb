"""Every algorithm preset trains end to end from the CLI, and grpo, dapo and dr_grpo learn a task
the random tiny model can learn by RL alone: start the completion with a digit (~30-50 % at first)."""

from __future__ import annotations

import json

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow

PRESETS = ["grpo", "dapo", "dr_grpo", "gspo", "rloo"]
MUST_LEARN = {"grpo", "dapo", "dr_grpo"}
STEPS = 30
LAST = 5  # learning is judged on the mean of the last steps, not on the best (noisy) one


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir):
    sweep_dir = tmp_path_factory.mktemp("presets")
    result = run_cli(["train", "-m", "+experiment=multiplication", "model=tiny", "reward=first_digit",
                      "data.batch_size=8", "data.eval_size=8", "rollout.max_tokens=4", "rollout.temperature=1.0",
                      # every completion is cut at 4 tokens: DAPO's length punishment would only add noise
                      "algorithm.overlong.mode=none", "optim.lr=3e-2", f"trainer.max_steps={STEPS}",
                      "trainer.save_model=false", "trainer.log_samples=0", f"algorithm={','.join(PRESETS)}",
                      f"hydra.sweep.dir={sweep_dir}"], cache=cache_dir, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {}
    for run in sweep_dir.iterdir():
        if (run / "metrics.jsonl").exists():
            name = json.loads((run / "manifest.json").read_text())["algorithm"]
            lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            runs[name] = [x for x in lines if "time/step_s" in x]
    return runs


def test_every_preset_runs_every_step(sweep):
    assert sorted(sweep) == sorted(PRESETS)
    for name, steps in sweep.items():
        assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), name
        # every step whose update ran a sequence really moved the policy, and measured the mismatch
        ran = [s for s in steps if s["learn/sequences"] > 0]
        assert len(ran) >= 5, name
        assert all(s["grad_norm"] > 0 and "mismatch/logprob_abs_max" in s for s in ran), name


@pytest.mark.parametrize("name", sorted(MUST_LEARN))
def test_preset_learns_the_first_digit_task(sweep, name):
    rewards = [s["reward/first_digit"] for s in sweep[name]]
    first, last = sum(rewards[:LAST]) / LAST, sum(rewards[-LAST:]) / LAST
    assert last >= 0.8 and last - first >= 0.25, f"{name}: reward per step {[round(r, 2) for r in rewards]}"


def test_dapo_filters_groups_without_signal(sweep):
    steps = sweep["dapo"]
    # Late in training most groups are all-correct; dynamic sampling drew extra rounds to refill.
    refilled = [s for s in steps if s["groups/extra_rounds"] > 0]
    assert refilled
    for s in refilled:
        assert s["groups/zero_adv_frac"] > 0  # the first round had groups without a signal ...
        if s["groups/extra_rounds"] < 3:  # ... and, unless the bound was hit, the batch was refilled
            assert s["groups/trained"] == 8
