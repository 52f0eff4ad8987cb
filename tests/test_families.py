"""The family matrix: every feature of the learner and the engine on a tiny random model of each model
family (`rlvr.models.tiny.FAMILIES`, built here as `model=tiny` is): the shared-prefix forward and the
cold start's packing equal to full rows, LoRA on the family's own layer names, compiled decoder
layers, a checkpoint's exact resume, RL steps whose weights reach the engine exactly, and the
transformers engine agreeing with vLLM. docs/families.md is the table of it."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from rlvr.learner import Learner, make_batch
from rlvr.learner.precision import CANARY_TOL
from rlvr.learner.scoring import shared_prefix_choice
from rlvr.modeling.logprobs import token_logprobs
from rlvr.models import build_atomically
from rlvr.models.tiny import FAMILIES, build_family
from rlvr.prompts import render
from rlvr.records import Prompt
from rlvr.rollout.engine import Canary, WeightSyncError, canary_sequence
from rlvr.rollout.hf_engine import TransformersEngine

from .conftest import compose_config
from .test_hf_engine import assert_each_scores_the_others_samples
from .test_shared_prefix import _batch, _compare

pytestmark = pytest.mark.slow

# (Llama, the tiny model itself, has each of these tests in the file of its feature: test_shared_prefix,
# test_lora, test_learner, test_checkpoint, test_engine, test_hf_engine.)
ALL = list(FAMILIES)
# Families vLLM serves with an implementation of its own (the others run with rollout.backend=transformers:
# rlvr.rollout.vllm_engine.check_model says why).
VLLM = [f for f in ALL if f != "olmo2"]
PROMPTS = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 7? Think it through step by step."}],
               answer=str(7 * a)) for a in (12, 3456)]
TOL = CANARY_TOL["float32"]


@pytest.fixture(scope="session")
def family_path(cache_dir):
    @functools.cache
    def path(family: str):
        folder = cache_dir / "models" / f"tiny-{family}"
        build_atomically(folder, lambda p: build_family(p, family))
        return folder
    return path


def _learner(cache_dir, path, *overrides) -> tuple:
    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.max_tokens=16", "algorithm.group_size=4",
                          *overrides], cache_dir)
    torch.manual_seed(0)
    return cfg, Learner(path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                        cfg.rollout.max_tokens, "cpu", lora=cfg.model.lora)


@pytest.mark.parametrize("family", ALL)
def test_shared_prefix_and_packing_equal_full_rows(family, family_path, cache_dir):
    """Logprobs, loss and every gradient of the shared-prefix forward (the cold start's packing is the
    same forward, one completion a group) against full rows, prompts and completions longer than the
    families' 16-token sliding windows; `learner.shared_prefix=auto` turns it on for the family."""
    path = family_path(family)
    extra = ["learner.micro_batch_size=3", "algorithm.kl.coef=0.1"]
    _, full = _learner(cache_dir, path, "learner.shared_prefix=false", *extra)
    _, shared = _learner(cache_dir, path, "learner.shared_prefix=true", *extra)
    batch = _batch(full, longest=24)
    assert int(batch.attention_mask.sum(dim=1).max()) > 32  # past the window
    assert _compare(full, shared, batch)["grad_norm"] > 0
    assert shared_prefix_choice("auto", full.policy.model.config.model_type, 4)[0] is True


@pytest.mark.parametrize("family", ALL)
def test_lora_adapts_every_linear_layer_by_the_familys_names(family, family_path, cache_dir):
    """`model.lora.target_modules=[all-linear]` (the default) puts adapters on every linear layer of the
    decoder layers, whatever the family calls them (Phi-3's fused qkv_proj, gate_up_proj), never on the
    head; the merged weights carry exactly the base model's names, which the engine loads."""
    path = family_path(family)
    _, plain = _learner(cache_dir, path)
    linear = {n for n, m in plain.policy.model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    _, learner = _learner(cache_dir, path, "model.lora.r=4")
    from peft.tuners.lora import LoraLayer

    adapted = {n.removeprefix("base_model.model.") for n, m in learner.policy.model.named_modules()
               if isinstance(m, LoraLayer)}
    assert adapted == linear and linear
    assert {n for n, _ in learner.policy.named_weights()} == {n for n, _ in plain.policy.named_weights()}
    batch = _batch(learner)
    assert learner.step(batch)["grad_norm"] > 0
    moved = [n for (n, a), (_, b) in zip(learner.policy.named_weights(), plain.policy.named_weights(), strict=True)
             if not torch.equal(a, b)]
    assert moved and all(".layers." in n for n in moved)


@pytest.mark.parametrize("family", ALL)
def test_compiled_layers_give_the_eager_logprobs_and_gradients(family, family_path, cache_dir):
    from rlvr.modeling.kernels import compile_layers, decoder_layers

    _, learner = _learner(cache_dir, family_path(family))
    eager = learner.policy.model
    compiled = copy.deepcopy(eager)
    compile_layers(compiled)
    layers = decoder_layers(compiled)
    assert len(layers) == compiled.config.num_hidden_layers
    assert all(layer._compiled_call_impl is not None for layer in layers)
    batch = _batch(learner)
    out = []
    for model in (eager, compiled):
        model.zero_grad()
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask) * batch.loss_mask
        logp.sum().backward()
        out.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert (out[0][0] - out[1][0]).abs().max() < 1e-4
    for n, g in out[0][1].items():
        assert (out[1][1][n] - g).abs().max() <= 1e-3 * g.abs().max() + 1e-8, n


@pytest.mark.parametrize("family", ALL)
def test_a_checkpoint_resumes_exactly(family, family_path, cache_dir, tmp_path):
    """The weights as a checkpoint writes them (model/, a tied head once) and AdamW's state: a learner
    built from them takes the next step to exactly the weights of the one that never stopped."""
    path = family_path(family)
    _, learner = _learner(cache_dir, path)
    first, second = _batch(learner, seed=1), _batch(learner, seed=2)
    learner.step(first)
    learner.policy.save(tmp_path / "model")
    learner.save_optimizer(tmp_path / "optimizer")
    state = learner.state_dict()
    learner.step(second)

    _, resumed = _learner(cache_dir, tmp_path / "model")
    resumed.load_optimizer(tmp_path / "optimizer")
    resumed.load_state_dict(state)
    resumed.step(second)
    for (name, a), (_, b) in zip(learner.policy.named_weights(), resumed.policy.named_weights(), strict=True):
        assert torch.equal(a, b), name


@pytest.fixture(scope="module", params=ALL)
def served(request, family_path, cache_dir):
    """(family, config, learner, engine): the family's learner and engine, shared by its tests."""
    from rlvr.rollout.engine import build_engine

    family = request.param
    path = family_path(family)
    backend = "vllm" if family in VLLM else "transformers"
    cfg, learner = _learner(cache_dir, path, f"rollout.backend={backend}", "rollout.temperature=1.0")
    engine = build_engine(path, cfg.rollout, "float32", 0, "cpu", cache_dir)
    yield family, cfg, learner, engine
    engine.close()


def test_rl_steps_reach_the_engine_exactly(served):
    """Every tensor the learner sends is compared exactly with the engine's own copy (vLLM keeps them
    fused and packed); two real RL steps, each synced, pass; a damaged tensor, a skipped sync fail."""
    family, cfg, learner, engine = served
    ids = [render(learner.policy.tokenizer, p) for p in PROMPTS]
    canary = Canary(canary_sequence(ids[0], [5, 6, 7, 8], engine.block_size(), cfg.rollout.max_model_len), TOL)
    engine.load_weights(canary.watch(learner.policy.named_weights()))
    canary.check(engine, learner.scorer.sequence_logprobs)
    # (vLLM's Gemma computes its logits with the embedding: a tied head is not sent, the embedding is compared)
    unloadable = getattr(engine, "unloadable", set())
    assert canary.fingerprinted == {n for n, _ in learner.policy.named_weights()} - unloadable
    for step in range(2):
        rollouts = engine.generate(PROMPTS, ids, n=4, seed=10 + step)
        batch = make_batch(rollouts, learner.policy.pad_id)
        with torch.no_grad():
            scores = learner.scorer.batch_logprobs(batch)
        assert ((scores - batch.old_logprobs).abs() * batch.loss_mask).max() < TOL  # the sampler's own logprobs
        batch.advantages = torch.tensor([1.0, -1.0] * 4)
        assert learner.step(batch)["grad_norm"] > 0
        engine.load_weights(canary.watch(learner.policy.named_weights()))
        canary.check(engine, learner.scorer.sequence_logprobs)
    damaged = next(n for n, _ in learner.policy.named_weights() if n.endswith("down_proj.weight"))
    engine.load_weights((n, t + 1e-3 if n == damaged else t) for n, t in canary.watch(learner.policy.named_weights()))
    with pytest.raises(WeightSyncError, match=f"copy of {damaged} is not what the learner sent"):
        canary.check(engine, learner.scorer.sequence_logprobs)


def test_the_transformers_engine_and_vllm_score_each_others_samples(served, family_path):
    """vLLM's logprobs of the tokens it sampled equal the transformers engine's scores of them, and the
    other way round (temperature 1)."""
    family, cfg, learner, engine = served
    if family not in VLLM:
        pytest.skip(f"vLLM does not serve {family} in the learner's process (rlvr.rollout.vllm_engine.check_model)")
    hf = TransformersEngine(family_path(family), cfg.rollout, "float32", seed=0, device="cpu")
    ids = [render(learner.policy.tokenizer, p) for p in PROMPTS]
    batch = make_batch(engine.generate(PROMPTS, ids, n=4, seed=3), learner.policy.pad_id)
    batch.advantages = torch.tensor([1.0, -1.0] * 4)
    learner.step(batch)  # weights that neither engine started from
    weights = dict(learner.policy.named_weights())
    hf.load_weights(weights.items())
    engine.load_weights(weights.items())
    try:
        assert_each_scores_the_others_samples(engine, hf, PROMPTS, ids, n=2)
    finally:
        hf.close()


def test_what_the_engine_cannot_serve_is_refused_in_one_line_before_anything_loads(family_path, tiny_path, cache_dir,
                                                                                   tmp_path):
    """An architecture vLLM would serve through its transformers backend (which changes transformers'
    classes in the learner's process: the learner then fails at its first forward), and a head size vLLM's
    CPU attention refuses (it said so only after both had loaded, at the first weight-sync check): one
    line naming the model, its family and what to do, before the learner or the engine loads."""
    import json
    import shutil

    from .conftest import cli_here

    narrow = tmp_path / "heads-of-16"
    shutil.copytree(tiny_path, narrow)
    config = json.loads((narrow / "config.json").read_text())
    (narrow / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, "num_key_value_heads": 4,
                                                    "head_dim": 16}))
    olmo = family_path("olmo2")
    for folder, line in [
        (olmo, f"model.path='{olmo}' (a 'olmo2' model, Olmo2ForCausalLM): vLLM has no implementation of its own for "
               "Olmo2ForCausalLM"),
        (narrow, f"model.path='{narrow}' (a 'llama' model, LlamaForCausalLM): attention heads of size 16, which "
                 "vLLM's CPU attention cannot run"),
    ]:
        result = cli_here(["train", "model=local", f"model.path={folder}", f"hydra.run.dir={tmp_path}/run"],
                          cache=cache_dir)
        assert result.returncode == 1
        errors = [x for x in result.stderr.splitlines() if "ERROR" in x]
        assert len(errors) == 1 and line in errors[0] and "rollout.backend=transformers" in errors[0], result.stderr
        assert "learner:" not in result.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()
