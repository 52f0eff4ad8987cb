"""The training loop's guards, driven in-process with the real vLLM CPU engine on model=tiny: a
sabotaged weight sync stops the run, dynamic sampling filters on what the advantage sees, and
prompts or settings that cannot fit the engine stop the run before it starts."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlvr.learner import Learner
from rlvr.prompts import PromptFit
from rlvr.recipe import train
from rlvr.rewards import Rewards
from rlvr.rollout.engine import WeightSyncError
from rlvr.rollout.vllm_engine import VllmEngine
from rlvr.train import collect_groups, shaped_scores

from .conftest import cli_here, compose_config

pytestmark = pytest.mark.slow

SMALL = ["+experiment=multiplication", "model=tiny", "data.batch_size=2", "algorithm.group_size=4",
         "rollout.max_tokens=16", "data.eval_size=4", "trainer.save_model=false"]


_LOAD = VllmEngine.load_weights
DAMAGED = "model.layers.0.mlp.down_proj.weight"


def _no_reset(self, named_tensors):
    """A sync that loads the weights but forgets vLLM's prefix-cache reset."""
    self.llm.collective_rpc("reload_weights",
                            kwargs={"weights_iterator": list(named_tensors), "is_checkpoint_format": True})


def _no_load(self, named_tensors):
    """A sync that never reaches the engine."""


def _damaged_row(self, named_tensors):
    """A sync that delivers one tensor with a damaged row (cut or scrambled on its way)."""
    def damaged(name, t):
        if name == DAMAGED:
            t = t.clone()
            t[0] += 0.5
        return name, t

    _LOAD(self, (damaged(name, t) for name, t in named_tensors))


# The faults are in rlvr's own sync code, which cannot be broken for real from outside: the real engine
# and the real loop run, only VllmEngine.load_weights is replaced by a faulty version of itself. The
# learning rate is make train's: one update changes the logprobs less than the canary's tolerance.
@pytest.mark.parametrize(("sabotage", "precision", "message"), [
    (_no_load, "fp32", r"did not pass \S+ \(and \d+ more tensors\) to the engine, which keeps its old copy"),
    (_damaged_row, "bf16-mixed", rf"engine.s copy of {DAMAGED} is not what the learner sent"),
    (_no_reset, "fp32", r"served \d+ tokens of the canary sequence from its prefix cache"),
    (_no_reset, "bf16-mixed", r"served \d+ tokens of the canary sequence from its prefix cache"),
], ids=["no_load", "damaged_row_bf16", "no_prefix_cache_reset", "no_prefix_cache_reset_bf16"])
def test_a_sabotaged_sync_stops_the_run_with_the_canary_message(tmp_path, cache_dir, monkeypatch, sabotage,
                                                                 precision, message):
    monkeypatch.setattr(VllmEngine, "load_weights", sabotage)
    cfg = compose_config([*SMALL, "reward=digits", "optim.lr=1e-5", "trainer.max_steps=3",
                          f"learner.precision={precision}"], cache_dir)
    with pytest.raises(WeightSyncError, match=message):
        train(cfg, tmp_path / "run")
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0]  # stopped at step 1's check: nothing of step 1 was logged


def test_dynamic_sampling_keeps_groups_by_their_shaped_scores(cache_dir, tiny_path):
    """The raw reward is 0 everywhere (no group has a signal in it); a shaping term that differs inside
    the first group only (as DAPO's overlong penalty or a KL reward would) gives that group a signal."""
    cfg = compose_config([*SMALL, "algorithm=dapo", "algorithm.dynamic_sampling.max_rounds=1", "algorithm.overlong.mode=none",
                          "reward=first_digit", "reward.terms.first_digit.kwargs.prefix=[QQQ]"], cache_dir)
    rewards = Rewards(cfg.reward)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                      cfg.rollout.max_tokens, "cpu")
    from rlvr.data import build_task

    task = build_task(cfg, tiny_path)
    fit = PromptFit(learner.policy.tokenizer, cfg.rollout.max_model_len, cfg.rollout.max_tokens)
    engine = VllmEngine(tiny_path, cfg.rollout, "float32", 0, "cpu", cache_dir)

    def score(rollouts):
        scores, metrics = shaped_scores(rollouts, rewards, learner, cfg)
        bonus = torch.zeros_like(scores)
        bonus[0, 0] = 0.5  # one sample of the first group of each round
        return scores + bonus, metrics

    try:
        c = collect_groups(task, fit, engine.generate, rewards, score, cfg, step=1)
        # without the bonus no group of any round has a signal: nothing is trained on
        flat = collect_groups(task, fit, engine.generate, rewards, lambda r: shaped_scores(r, rewards, learner, cfg),
                              cfg, step=2)
    finally:
        engine.close()
    assert all(r.reward == 0 for r in c.first_round)
    # Two rounds (max_rounds=1), the first group of each kept: 2 groups, each with exactly one non-zero score.
    assert c.rounds == 1 and c.scores.shape == (2, 4)
    assert c.scores[:, 0].tolist() == [0.5, 0.5] and c.scores[:, 1:].abs().sum() == 0
    assert flat.rounds == 1 and flat.rollouts == [] and flat.scores.shape == (0, 4) and len(flat.first_round) == 8


def test_prompts_that_cannot_fit_the_context_stop_the_run_at_start(tmp_path, cache_dir):
    # function picking on the tiny model's byte-level tokenizer: prompts of ~500-1200 tokens
    result = cli_here(["train", "+experiment=function_picking", "model=tiny", "rollout.max_model_len=300",
                      f"hydra.run.dir={tmp_path / 'run'}"], cache=cache_dir)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "none of the" in out and "rollout.max_model_len=300" in out and "Traceback" not in out
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_kv_cache_too_small_for_one_sequence_is_named(tmp_path, cache_dir):
    result = cli_here(["train", *SMALL, "rollout.kv_cache_gib=0.00001", f"hydra.run.dir={tmp_path / 'run'}"],
                     cache=cache_dir)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "rollout.kv_cache_gib=1e-05 cannot hold one sequence of rollout.max_model_len=1024" in out
    assert "gpu_memory_utilization" not in out and "Traceback" not in out


def test_resume_auto_without_a_checkpoint_says_what_is_there(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    result = cli_here(["train", *SMALL, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "holds a run (metrics.jsonl) but no complete checkpoint" in out and "trainer.overwrite=true" in out
    assert "Continue it with trainer.resume=auto" not in out


def test_the_engine_start_leaves_the_hub_setting_as_it_was(cache_dir, tiny_path):
    import huggingface_hub.constants as hub

    before = os.environ.get("HF_HUB_OFFLINE"), hub.HF_HUB_OFFLINE
    cfg = compose_config(["model=tiny"], cache_dir)
    engine = VllmEngine(tiny_path, cfg.rollout, "float32", 0, "cpu", cache_dir)
    engine.close()
    assert (os.environ.get("HF_HUB_OFFLINE"), hub.HF_HUB_OFFLINE) == before


class _Cycle:
    """A task drawing its prompts from a list, in order, round and round (a state of one number)."""

    def __init__(self, prompts):
        self.prompts, self.position = prompts, 0

    def sample(self, n):
        out = [self.prompts[(self.position + i) % len(self.prompts)] for i in range(n)]
        self.position += n
        return out

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_the_start_check_draws_as_many_prompts_as_a_step_may(tiny_path):
    """A task whose first few prompts are too long but later ones fit starts (a step draws again, up to
    MAX_DRAWS rounds); one none of whose prompts fits is refused; the task's position is put back."""
    from transformers import AutoTokenizer

    from rlvr.prompts import ContextError, PromptFit
    from rlvr.records import Prompt

    fit = PromptFit(AutoTokenizer.from_pretrained(tiny_path), max_model_len=128, max_tokens=16)
    long, short = Prompt([{"role": "user", "content": "7 * 8 " * 100}], ""), Prompt([{"role": "user", "content": "hi"}], "")
    task = _Cycle([long] * 9 + [short])
    fit.probe(task, 4)  # the first 4 are all too long, the 10th fits
    assert task.position == 0
    with pytest.raises(ContextError, match="none of the 40 sampled training prompts fits"):
        fit.probe(_Cycle([long]), 4)
