"""LoRA (model.lora.r > 0) on the tiny model: only the adapters train, the KL reference is the base
with the adapters off, the engine serves the merged weights (canary), a killed run resumes exactly,
and the final model is a plain Hugging Face folder that transformers and vLLM load."""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlvr.config import check
from rlvr.errors import ConfigError
from rlvr.learner import Learner, make_batch
from rlvr.learner.lora import merged_weights
from rlvr.learner.precision import CANARY_TOL
from rlvr.modeling.logprobs import token_logprobs
from rlvr.models import ModelError
from rlvr.prompts import render
from rlvr.records import Prompt
from rlvr.rollout.engine import canary_sequence, check_canary
from rlvr.rollout.vllm_engine import VllmEngine

from .conftest import compose_config, run_cli
from .test_checkpoint import COMPARED, RUN, _start, _steps, _wait_for_step

pytestmark = pytest.mark.slow

PROMPTS = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 7?"}], answer=str(7 * a)) for a in (12, 345)]
TOL = CANARY_TOL["float32"]


@pytest.fixture(scope="module")
def parts(cache_dir, tiny_path):
    cfg = compose_config(["model=tiny", "model.lora.r=4", "optim.lr=1e-2", "rollout.max_tokens=16",
                          "algorithm.kl.coef=0.1"], cache_dir)
    torch.manual_seed(0)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                      cfg.rollout.max_tokens, "cpu", lora=cfg.model.lora)
    engine = VllmEngine(tiny_path, cfg.rollout, "float32", seed=0, device="cpu", cache_dir=cache_dir)
    ids = [render(learner.policy.tokenizer, p) for p in PROMPTS]
    rollouts = engine.generate(PROMPTS, ids, n=4, seed=1)
    batch = make_batch(rollouts, learner.policy.pad_id)
    batch.advantages = torch.tensor([1.0, -1.0] * 4)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    stats = learner.step(batch)
    yield learner, engine, ids, batch, before, stats
    engine.close()


def test_only_the_adapters_train(parts):
    learner, _, _, _, before, stats = parts
    after = learner.policy.model.state_dict()
    adapters = [k for k in after if ".lora_" in k]
    assert adapters and stats["grad_norm"] > 0
    assert all(torch.equal(before[k], after[k]) for k in after if ".lora_" not in k)  # the base is frozen
    assert any(not torch.equal(before[k], after[k]) for k in adapters)
    trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    named = dict(learner.policy.model.named_parameters())
    assert trained == {id(p) for n, p in named.items() if ".lora_" in n}
    assert len(learner.optimizer.state) == len(trained)  # optimizer state for the adapters alone


def test_the_reference_is_the_base_with_adapters_off(parts, tiny_path):
    learner, _, _, batch, _, _ = parts
    assert learner.policy.ref is None  # no second copy
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    with torch.no_grad():
        want = token_logprobs(base, batch.input_ids, batch.attention_mask, learner.scorer.temperature) * batch.loss_mask
    ref = learner.scorer.batch_logprobs(batch, reference=True) * batch.loss_mask
    policy = learner.scorer.batch_logprobs(batch) * batch.loss_mask
    assert (ref - want).abs().max() < 1e-5
    assert (policy - want).abs().max() > 1e-4  # the adapters did move the policy away from it


def test_the_engine_gets_the_merged_weights(parts):
    learner, engine, ids, _, _, _ = parts
    merged = copy.deepcopy(learner.policy.model).merge_and_unload().state_dict()  # peft's own merge
    ours = dict(merged_weights(learner.policy.model))
    assert ours.keys() == merged.keys()  # the base model's Hugging Face names, no adapter entries
    assert max((ours[k] - merged[k]).abs().max().item() for k in ours) < 1e-6
    canary = canary_sequence(ids[0], [5, 6, 7], engine.block_size(), 1024)
    with pytest.raises(Exception, match="canary"):  # the engine still serves the base
        check_canary(engine, learner.scorer.sequence_logprobs, canary, TOL)
    engine.load_weights(learner.policy.named_weights())
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, TOL) < TOL


def test_bad_lora_settings_fail_naming_the_key(tiny_path, cache_dir):
    with pytest.raises(ConfigError, match="model.lora.r"):
        check(compose_config(["model=tiny", "model.lora.r=-1"]))
    cfg = compose_config(["model=tiny", "model.lora.r=4", "model.lora.target_modules=[c_attn]"], cache_dir)
    with pytest.raises(ModelError, match="model.lora.target_modules: this model has no layer named c_attn"):
        Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 16, "cpu", lora=cfg.model.lora)


LORA = [*RUN, "model.lora.r=4", "model.lora.alpha=8", "optim.lr=1e-2", "algorithm.kl.coef=0.05",
        "trainer.save_model=true", "trainer.max_steps=4", "trainer.save_every=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    result = run_cli(["train", *LORA, f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_a_killed_lora_run_resumes_exactly(reference, tmp_path, cache_dir):
    last = reference / "checkpoints" / "step-000004"
    assert (last / "adapter" / "adapter_config.json").is_file() and (last / "model" / "config.json").is_file()
    run_dir = tmp_path / "run"
    proc = _start([*LORA, f"hydra.run.dir={run_dir}"], cache_dir)
    _wait_for_step(proc, run_dir, 3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    result = run_cli(["train", *LORA, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, expected = _steps(run_dir), _steps(reference)
    assert [s["step"] for s in resumed] == [1, 2, 3, 4]
    assert all(s["kl"] > 0 for s in expected[1:])
    for got, want in zip(resumed, expected, strict=True):
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)
    got, want = load_file(run_dir / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert max((got[k] - want[k]).abs().max().item() for k in got) < 1e-6


def test_the_final_model_is_a_merged_folder_that_vllm_and_transformers_load(reference, cache_dir, tiny_path):
    folder = reference / "model"
    weights = load_file(folder / "model.safetensors")
    base = load_file(tiny_path / "model.safetensors")
    assert weights.keys() == base.keys()  # no adapter entries, the base model's names
    assert any(not torch.equal(weights[k], base[k]) for k in base)  # and it trained
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    cfg = compose_config(["model=tiny"], cache_dir)
    engine = VllmEngine(folder, cfg.rollout, "float32", seed=0, device="cpu", cache_dir=cache_dir)
    try:
        ids = list(range(3, 40))
        with torch.no_grad():
            want = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
        assert (engine.sequence_logprobs(ids) - want).abs().max() < TOL
    finally:
        engine.close()
