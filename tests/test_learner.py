"""The learner on the tiny model: micro-batching does not change the update; the knobs do what they say."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from rlvr.algorithms.losses import Normaliser, tis_weight
from rlvr.algorithms.objective import policy_loss
from rlvr.learner import Learner, make_batch
from rlvr.modeling import kernels
from rlvr.modeling.kernels import compile_choice, decoder_layers
from rlvr.modeling.logprobs import token_logprobs
from rlvr.models import ModelError
from rlvr.records import Prompt, Rollout

from .conftest import compose_config


def _learner(cache_dir, tiny_path, *overrides) -> Learner:
    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.max_tokens=12", *overrides], cache_dir)
    return Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                   cfg.rollout.max_tokens, "cpu")


def _batch(n=8, seed=0):
    rng = random.Random(seed)
    prompt = Prompt(messages=[], answer="")
    rollouts = []
    for i in range(n):
        p = [rng.randrange(3, 500) for _ in range(rng.randint(3, 6))]
        c = [rng.randrange(3, 500) for _ in range(rng.randint(1, 12))]
        rollouts.append(Rollout(prompt=prompt, group=i // 4, prompt_ids=p, completion_ids=c,
                                sampler_logprobs=[-6.2 + 0.1 * rng.random() for _ in c], text="",
                                finish_reason="length" if len(c) == 12 else "stop"))
    batch = make_batch(rollouts, pad_id=0)
    batch.advantages = torch.tensor([rng.choice([-1.0, 0.0, 0.5, 1.0]) for _ in range(n)])
    return batch


def _params(learner):
    return {k: v.clone() for k, v in learner.policy.named_weights()}


@pytest.mark.parametrize("extra", [
    ["algorithm.loss_agg=token_mean"],
    ["algorithm.loss_agg=seq_mean_token_mean"],
    ["algorithm=dr_grpo"],
    ["algorithm=gspo"],
    ["algorithm.kl.coef=0.1"],
    ["algorithm.tis_cap=2.0"],
])
def test_micro_batching_does_not_change_the_update(cache_dir, tiny_path, extra):
    whole = _learner(cache_dir, tiny_path, "learner.micro_batch_size=8", *extra)
    split = _learner(cache_dir, tiny_path, "learner.micro_batch_size=3", *extra)
    a, b = whole.step(_batch()), split.step(_batch())
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    # Compare the accumulated gradients (Adam's first step is sign-like and would magnify float noise).
    grads_whole = {k: p.grad for k, p in whole.policy.model.named_parameters()}
    grads_split = {k: p.grad for k, p in split.policy.model.named_parameters()}
    assert any(g is not None and g.abs().sum() > 0 for g in grads_whole.values())
    for k, g in grads_whole.items():
        assert torch.allclose(g, grads_split[k], atol=1e-7, rtol=1e-4), k


def test_all_zero_advantages_change_nothing(cache_dir, tiny_path):
    learner = _learner(cache_dir, tiny_path)
    before = _params(learner)
    batch = _batch()
    batch.advantages.zero_()
    stats = learner.step(batch)
    assert stats["learn/sequences"] == 0 and stats["grad_norm"] == 0
    assert all(torch.equal(v, before[k]) for k, v in learner.policy.named_weights())


@pytest.mark.parametrize("empty", ["zero advantages", "no rollouts"])
def test_nothing_to_learn_from_takes_no_step_after_real_ones(cache_dir, tiny_path, empty):
    # After a real update AdamW's moments are non-zero: a step on zero gradients would still move the
    # weights. With nothing to learn from no backward runs, and AdamW passes over parameters without one.
    learner = _learner(cache_dir, tiny_path, "optim.weight_decay=0.1")
    learner.step(_batch())
    before = _params(learner)
    batch = _batch(seed=1) if empty == "zero advantages" else make_batch([], pad_id=0)
    batch.advantages.zero_()
    stats = learner.step(batch)
    assert stats["learn/sequences"] == 0 and stats["grad_norm"] == 0
    assert all(torch.equal(v, before[k]) for k, v in learner.policy.named_weights())


def test_epochs_and_mini_batches_take_that_many_optimizer_steps(cache_dir, tiny_path):
    learner = _learner(cache_dir, tiny_path, "algorithm.ppo_epochs=2", "algorithm.mini_batches=2")
    stats = learner.step(_batch())
    assert stats["learn/optimizer_steps"] == 4
    assert stats["clip_frac"] > 0  # later passes move off-policy, far enough at lr 1e-2 for the clip to bite


def test_reference_model_only_when_kl_is_used(cache_dir, tiny_path):
    assert _learner(cache_dir, tiny_path).policy.ref is None
    with_kl = _learner(cache_dir, tiny_path, "algorithm.kl.coef=0.1")
    assert with_kl.policy.ref is not None
    stats = with_kl.step(_batch())
    assert stats["kl"] == pytest.approx(0.0, abs=1e-9)  # the first update starts at the reference
    assert with_kl.step(_batch(seed=1))["kl"] > 0  # after one update the policy has moved


def test_mask_truncated_drops_cut_completions_from_the_loss():
    rollouts = [Rollout(prompt=Prompt(messages=[], answer=""), group=0, prompt_ids=[1, 2], completion_ids=c,
                        sampler_logprobs=[-1.0] * len(c), text="", finish_reason=f)
                for c, f in [([3, 4, 5], "length"), ([3, 4], "stop")]]
    assert make_batch(rollouts, 0).loss_mask.sum(dim=1).tolist() == [3, 2]
    assert make_batch(rollouts, 0, mask_truncated=True).loss_mask.sum(dim=1).tolist() == [0, 2]


def test_warmup_counts_rl_steps_not_optimizer_steps(cache_dir, tiny_path):
    # 2 epochs x 2 mini-batches = 4 optimizer steps per RL step; warmup over 4 RL steps, lr 1e-2.
    learner = _learner(cache_dir, tiny_path, "optim.warmup_steps=4", "algorithm.ppo_epochs=2",
                       "algorithm.mini_batches=2")
    lrs = [learner.step(_batch(seed=s))["lr"] for s in range(5)]
    assert lrs == pytest.approx([0.25e-2, 0.5e-2, 0.75e-2, 1e-2, 1e-2])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gspo_preset_is_not_clipped_by_the_engine_learner_mismatch(cache_dir, tiny_path, sign):
    """GSPO clips the sequence ratio at 1 -/+ 3e-4 / 4e-4, far inside the 1e-3 per token that the canary
    tolerates between engine and learner: with the sampler's logprobs as the old policy, whole sequences
    would be clipped on the first update. The preset takes the learner's own logprobs (and TIS)."""
    def mismatched_batch(learner):
        batch = _batch()
        batch.old_logprobs = (learner.scorer.batch_logprobs(batch) + sign * 1e-3) * batch.loss_mask
        return batch

    preset = _learner(cache_dir, tiny_path, "algorithm=gspo")
    assert preset.step(mismatched_batch(preset))["clip_frac"] == 0.0
    sampler_anchor = _learner(cache_dir, tiny_path, "algorithm=gspo", "algorithm.tis_cap=null")
    assert sampler_anchor.step(mismatched_batch(sampler_anchor))["clip_frac"] > 0.2


def test_tis_scores_only_the_sequences_the_update_runs(cache_dir, tiny_path):
    """The learner's own old logprobs (TIS) are computed for the sequences with a non-zero advantage only
    (the update never reads the others): with two optimizer steps per batch their forward costs exactly
    as many tokens as the update itself; with one (the default) the update's own forwards give them."""
    batch = _batch()
    assert (batch.advantages == 0).any() and (batch.advantages != 0).any()
    two_steps = ["algorithm.mini_batches=2"]
    with_tis = _learner(cache_dir, tiny_path, "algorithm.tis_cap=2.0", *two_steps).step(batch)
    without = _learner(cache_dir, tiny_path, "algorithm.tis_cap=null", *two_steps).step(_batch())
    assert with_tis["learn/tokens"] == 2 * without["learn/tokens"]
    assert with_tis["mismatch/tokens"] == float(batch.loss_mask[batch.advantages != 0].sum())
    one_step = _learner(cache_dir, tiny_path, "algorithm.tis_cap=2.0").step(_batch())
    assert one_step["learn/tokens"] == without["learn/tokens"]
    assert one_step["mismatch/tokens"] == with_tis["mismatch/tokens"]


@pytest.mark.parametrize("extra", [["algorithm.tis_cap=2.0"], ["algorithm=gspo"], ["algorithm.tis_cap=2.0", "algorithm.kl.coef=0.1"]])
def test_tis_from_the_update_s_own_forward_is_the_objective_of_the_whole_batch(cache_dir, tiny_path, extra):
    """With one optimizer step per batch, TIS's learner logprobs are taken from the update's forwards
    (micro-batches of 3, shared prefix), which run at the old weights: the same loss, clipped tokens,
    mismatch and gradient as the pure objective on one plain forward of the whole batch, whose own
    detached logprobs are the old policy (and, at the first step, the KL reference)."""
    own = _learner(cache_dir, tiny_path, "learner.micro_batch_size=3", *extra)
    by_hand = _learner(cache_dir, tiny_path, *extra)
    batch = _batch()
    batch.old_logprobs = batch.old_logprobs + 0.05 * torch.randn_like(batch.old_logprobs)  # a sampler mismatch
    stats = own.step(batch)

    mask = batch.loss_mask
    logp = token_logprobs(by_hand.policy.model, batch.input_ids, batch.attention_mask, by_hand.scorer.temperature)  # [N, T-1]
    old = logp.detach()
    norm = Normaliser(int(mask.sum()), len(batch), by_hand.max_tokens)
    weight = tis_weight(old, batch.old_logprobs, mask, by_hand.tis_cap)
    ref = old if by_hand.rl.config.kl_coef > 0 else None
    loss, expected = policy_loss(logp, old, ref, batch.advantages, mask, by_hand.rl.config, norm, weight)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(list(by_hand.policy.model.parameters()), by_hand.optim_cfg.max_grad_norm)

    assert stats["loss"] == pytest.approx(expected.loss, rel=1e-5, abs=1e-7)
    assert stats["clip_frac"] * expected.tokens == pytest.approx(expected.clipped)
    scored = batch.advantages != 0 if by_hand.rl.config.kl_coef == 0 else torch.ones(len(batch), dtype=torch.bool)
    gap = ((old - batch.old_logprobs).abs() * mask)[scored]
    assert stats["mismatch/logprob_abs_mean"] == pytest.approx(float(gap.sum() / mask[scored].sum()), rel=1e-5)
    assert stats["grad_norm"] == pytest.approx(float(grad_norm), rel=1e-4)
    grads = dict(own.policy.model.named_parameters())
    for k, p in by_hand.policy.model.named_parameters():
        assert torch.allclose(p.grad, grads[k].grad, atol=1e-7, rtol=1e-4), k


def test_eager_attention_only_for_short_cpu_forwards():
    from rlvr.modeling.kernels import EAGER_MAX_ELEMENTS, attention_kernel

    assert attention_kernel("cpu", 1, 300, 9) == "eager"  # a group of 8 packed in one lane: 0.8M attention weights
    assert attention_kernel("cpu", 5, 464, 9) == "sdpa"  # 64 sequences of multiplication in 5 lanes: 9.7M
    assert attention_kernel("cpu", 8, 2048, 9) == "sdpa"  # 302M: SDPA, whose memory grows with the width alone
    assert attention_kernel("cpu", 1, int(EAGER_MAX_ELEMENTS**0.5) + 1, 1) == "sdpa"
    assert attention_kernel("cuda:0", 1, 16, 9) == "sdpa"


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile's CPU code needs g++")
@pytest.mark.parametrize("extra", [[], ["model.lora.r=4"]])
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_compiled_decoder_layers_compute_what_eager_ones_do(cache_dir, tiny_path, monkeypatch, kernel, extra):
    """In float32 (where compiling changes no rounding that matters) compiled layers give eager's logprobs
    and gradients, with each attention kernel and with LoRA; after the weights change in place (an
    update, a resume), the no-grad forward compiled before it (the canary's) reads the new weights."""
    torch._dynamo.reset()  # compile afresh here, whatever other tests compiled in this process
    if kernel == "sdpa":
        monkeypatch.setattr(kernels, "EAGER_MAX_ELEMENTS", 0)
    eager, compiled = (_learner(cache_dir, tiny_path, f"learner.compile={c}", *extra) for c in ("false", "true"))
    if extra:  # LoRA's B starts at 0, which would leave A without a gradient
        with torch.no_grad():
            for name, p in eager.policy.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.1)
        compiled.policy.model.load_state_dict(eager.policy.model.state_dict())
    layers = decoder_layers(compiled.policy.model)
    assert compiled.policy.compiled and not eager.policy.compiled and len(layers) == compiled.policy.model.config.num_hidden_layers
    assert all(layer._compiled_call_impl is not None for layer in layers)
    seq = [5, 17, 300, 42, 8, 99, 123, 7]
    before = eager.scorer.sequence_logprobs(seq)
    assert torch.allclose(compiled.scorer.sequence_logprobs(seq), before, atol=1e-5)
    batch = _batch()
    a, b = eager.step(batch), compiled.step(batch)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["grad_norm"] > 0 and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    grads = dict(compiled.policy.model.named_parameters())
    for k, p in eager.policy.model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(p.grad, grads[k].grad, atol=1e-7, rtol=1e-4), k
    # Adam's first step is sign-like (float noise in a near-zero gradient flips it): copy the weights over.
    compiled.policy.model.load_state_dict(eager.policy.model.state_dict())
    after = eager.scorer.sequence_logprobs(seq)
    assert (after - before).abs().max() > 1e-2  # the update moved the policy
    assert torch.allclose(compiled.scorer.sequence_logprobs(seq), after, atol=1e-5)
    assert torch.allclose(compiled.scorer.batch_logprobs(batch), eager.scorer.batch_logprobs(batch), atol=1e-5)


@pytest.mark.parametrize(("setting", "bf16", "device", "expected"), [
    ("auto", True, "cpu", shutil.which("g++") is not None), ("auto", False, "cpu", False),
    ("auto", True, "cuda", False), (True, False, "cpu", True), (False, True, "cpu", False),
])
def test_compile_auto_only_where_it_was_measured_to_help(setting, bf16, device, expected):
    on, why = compile_choice(setting, bf16, device)
    assert on is expected and why


def test_compile_without_a_cxx_compiler_is_refused_or_skipped(cache_dir, tiny_path, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no g++ on it
    with pytest.raises(ModelError, match=r"learner.compile=true needs a C\+\+ compiler \(g\+\+\)"):
        _learner(cache_dir, tiny_path, "learner.compile=true")
    assert compile_choice("auto", True, "cpu") == (False, "no C++ compiler (g++) for torch.compile's CPU code")
