"""The transformers rollout engine on the tiny model, checked against the learner and against the
real vLLM engine: each backend's sampled-token logprobs equal the other's scores of those tokens."""

from __future__ import annotations

import pytest
import torch

from rlvr.learner import make_batch
from rlvr.learner.precision import CANARY_TOL
from rlvr.modeling.logprobs import token_logprobs
from rlvr.prompts import render
from rlvr.records import Prompt
from rlvr.rollout.engine import WeightSyncError, canary_sequence, check_canary
from rlvr.rollout.hf_engine import TransformersEngine
from rlvr.rollout.vllm_engine import VllmEngine

from .conftest import compose_config, run_cli, tiny_learner

pytestmark = pytest.mark.slow

PROMPTS = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 7?"}], answer=str(7 * a)) for a in (12, 3456)]
TOL = CANARY_TOL["float32"]


@pytest.fixture(scope="module")
def parts(cache_dir, tiny_path):
    cfg, learner = tiny_learner(cache_dir, tiny_path)
    engine = TransformersEngine(tiny_path, cfg.rollout, "float32", seed=0, device="cpu")
    ids = [render(learner.policy.tokenizer, p) for p in PROMPTS]
    yield cfg, learner, engine, ids
    engine.close()


def test_groups_lengths_and_per_sample_seeds(parts):
    _, _, engine, ids = parts
    rollouts = engine.generate(PROMPTS, ids, n=4, seed=1)
    assert [r.group for r in rollouts] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [len(r.prompt_ids) for r in rollouts] == [len(ids[0])] * 4 + [len(ids[1])] * 4  # prompts differ in length
    for r in rollouts:
        assert 1 <= len(r.completion_ids) <= 16 and len(r.sampler_logprobs) == len(r.completion_ids)
        assert r.finish_reason == ("stop" if r.completion_ids[-1] in engine.eos else "length")
        assert r.finish_reason == "stop" or len(r.completion_ids) == 16
        assert not any(t in engine.eos for t in r.completion_ids[:-1])  # decoding stops at the first eos
        assert r.text == engine.tokenizer.decode(r.completion_ids, skip_special_tokens=True)
    assert len({tuple(r.completion_ids) for r in rollouts}) == 8
    again = engine.generate(PROMPTS, ids, n=4, seed=1)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]
    # sample (i, j) draws from stream seed + i*n + j, whatever else is in the batch
    alone = engine.generate(PROMPTS[1:], ids[1:], n=1, seed=1 + 1 * 4 + 2)
    assert alone[0].completion_ids == rollouts[6].completion_ids


def test_sampler_logprobs_are_the_learners_at_the_sampling_temperature(parts):
    cfg, learner, engine, ids = parts
    rollouts = engine.generate(PROMPTS, ids, n=4, seed=3)
    batch = make_batch(rollouts, learner.policy.pad_id)
    with torch.no_grad():
        scores = token_logprobs(learner.policy.model, batch.input_ids, batch.attention_mask, cfg.rollout.temperature)
    for k, r in enumerate(rollouts):
        start = len(r.prompt_ids) - 1
        learner_lp = scores[k, start : start + len(r.completion_ids)]
        assert (learner_lp - torch.tensor(r.sampler_logprobs)).abs().max() < TOL


def assert_each_scores_the_others_samples(a, b, prompts, ids, n: int) -> None:
    """Each engine's logprobs of the tokens the other sampled (temperature 1) equal the sampler's own."""
    for sampler, scorer in ((a, b), (b, a)):
        rollouts = sampler.generate(prompts, ids, n=n, seed=7)
        assert sum(len(r.completion_ids) for r in rollouts) > 16
        for r in rollouts:
            scored = scorer.sequence_logprobs(r.prompt_ids + r.completion_ids)[len(r.prompt_ids) - 1:]
            diff = (scored - torch.tensor(r.sampler_logprobs)).abs().max().item()
            assert diff < TOL, f"{type(sampler).__name__} sampled, {type(scorer).__name__} scored: {diff:.3g}"


def test_each_backend_checks_the_others_logprobs(parts, cache_dir, tiny_path):
    """vLLM's logprobs of the tokens it sampled equal the transformers engine's scores of them, and
    the other way round (temperature 1, where both engines score sequences)."""
    cfg = compose_config(["model=tiny", "rollout.temperature=1.0", "rollout.max_tokens=16"], cache_dir)
    hf = TransformersEngine(tiny_path, cfg.rollout, "float32", seed=0, device="cpu")
    vllm = VllmEngine(tiny_path, cfg.rollout, "float32", seed=0, device="cpu", cache_dir=cache_dir)
    ids = parts[3]
    try:
        assert_each_scores_the_others_samples(vllm, hf, PROMPTS, ids, n=4)
    finally:
        vllm.close()
        hf.close()


def test_sync_and_canary(parts):
    cfg, learner, engine, ids = parts
    canary = canary_sequence(ids[0], [5, 6, 7], engine.block_size(), cfg.rollout.max_model_len)
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, TOL) < TOL
    rollouts = engine.generate(PROMPTS, ids, n=4, seed=1)
    batch = make_batch(rollouts, learner.policy.pad_id)
    batch.advantages = torch.tensor([1.0, -1.0] * 4)
    learner.step(batch)
    with pytest.raises(WeightSyncError, match="canary"):  # the engine still holds the old weights
        check_canary(engine, learner.scorer.sequence_logprobs, canary, TOL)
    engine.load_weights(learner.policy.named_weights())
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, TOL) < TOL
    with pytest.raises(WeightSyncError, match="'nope'"):
        engine.load_weights([("nope", torch.zeros(1))])


def test_rlvr_train_with_the_transformers_backend(tmp_path, cache_dir):
    run = tmp_path / "run"
    result = run_cli(["train", "+experiment=multiplication", "model=tiny", "rollout.backend=transformers",
                      "trainer.max_steps=2", "rollout.max_tokens=8", "data.eval_size=4", "trainer.save_model=false",
                      f"hydra.run.dir={run}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if "time/step_s" in line]
    assert len(steps) == 2 and all('"sync/logprob_max_diff"' in s for s in steps)


def test_rlvr_trains_where_vllm_does_not_import(tmp_path, cache_dir):
    """A machine without a working vLLM (here: a package named vllm whose import fails, first on the
    path): the transformers backend trains, and the vLLM backend says what to use instead."""
    shim = tmp_path / "shim" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no vLLM build for this machine')\n")
    env = {"PYTHONPATH": str(tmp_path / "shim")}
    args = ["train", "+experiment=multiplication", "model=tiny", "trainer.max_steps=1", "rollout.max_tokens=8",
            "data.eval_size=4", "trainer.save_model=false"]
    result = run_cli([*args, "rollout.backend=transformers", f"hydra.run.dir={tmp_path}/a"], cache=cache_dir,
                     extra_env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformers engine" in (tmp_path / "a" / "train.log").read_text()
    result = run_cli([*args, f"hydra.run.dir={tmp_path}/b"], cache=cache_dir, extra_env=env)
    assert result.returncode == 1
    assert "rollout.backend=vllm, but vLLM does not import here: no vLLM build" in result.stderr
    assert "rollout.backend=transformers" in result.stderr
