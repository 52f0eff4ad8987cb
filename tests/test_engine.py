"""The real vLLM CPU engine on the tiny model: group rollouts, weight sync, and the canary."""

from __future__ import annotations

import pytest
import torch

from rlvr.learner import make_batch
from rlvr.learner.precision import CANARY_TOL
from rlvr.modeling.logprobs import token_logprobs
from rlvr.prompts import render
from rlvr.records import Prompt
from rlvr.rollout import fingerprint
from rlvr.rollout.engine import Canary, EngineError, WeightSyncError, canary_sequence, check_canary
from rlvr.rollout.vllm_engine import VllmEngine

from .conftest import tiny_learner

pytestmark = pytest.mark.slow

DAMAGED = "model.layers.1.mlp.down_proj.weight"
PROMPTS = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 7?"}], answer=str(7 * a)) for a in (12, 34)]


@pytest.fixture(scope="module")
def parts(cache_dir, tiny_path):
    cfg, learner = tiny_learner(cache_dir, tiny_path)
    engine = VllmEngine(tiny_path, cfg.rollout, "float32", seed=0, device="cpu", cache_dir=cache_dir)
    yield cfg, learner, engine
    engine.close()


def _batch(learner, rollouts):
    batch = make_batch(rollouts, learner.policy.pad_id)
    batch.advantages = torch.tensor([1.0, -1.0] * (len(rollouts) // 2))
    return batch


def _generate(learner, engine, seed=1):
    return engine.generate(PROMPTS, [render(learner.policy.tokenizer, p) for p in PROMPTS], n=4, seed=seed)


def test_one_request_per_prompt_gives_a_group_with_logprobs(parts):
    _, learner, engine = parts
    rollouts = _generate(learner, engine)
    assert [r.group for r in rollouts] == [0, 0, 0, 0, 1, 1, 1, 1]
    for r in rollouts:
        assert 1 <= len(r.completion_ids) <= 16
        assert len(r.sampler_logprobs) == len(r.completion_ids)
        assert r.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in r.sampler_logprobs)
    assert len({tuple(r.completion_ids) for r in rollouts[:4]}) > 1  # distinct samples in a group
    again = _generate(learner, engine)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]  # seeded


def test_sampler_logprobs_match_the_learner_at_the_sampling_temperature(parts):
    cfg, learner, engine = parts
    rollouts = _generate(learner, engine, seed=5)
    batch = make_batch(rollouts, learner.policy.pad_id)
    with torch.no_grad():
        logp = token_logprobs(learner.policy.model, batch.input_ids, batch.attention_mask, cfg.rollout.temperature)
    gap = ((logp - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert gap < 1e-3


def test_sync_serves_new_weights_and_a_skipped_sync_is_caught(parts):
    cfg, learner, engine = parts
    canary = canary_sequence(render(learner.policy.tokenizer, PROMPTS[0]), [5, 6, 7, 8], engine.block_size(), 1024)
    tol = CANARY_TOL["float32"]
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, tol) <= tol

    # Two real updates (non-zero advantages), each followed by a sync: the engine keeps up.
    for step in range(2):
        before = {k: v.clone() for k, v in learner.policy.named_weights()}
        rollouts = _generate(learner, engine, seed=10 + step)
        stats = learner.step(_batch(learner, rollouts))
        assert stats["grad_norm"] > 0 and stats["learn/skipped_updates"] == 0.0
        changed = [k for k, v in learner.policy.named_weights() if not torch.equal(v, before[k])]
        assert changed, "the update changed no parameter"
        engine.load_weights(learner.policy.named_weights())
        assert check_canary(engine, learner.scorer.sequence_logprobs, canary, tol) <= tol

    # An update the engine never hears of must stop the run.
    rollouts = _generate(learner, engine, seed=99)
    learner.step(_batch(learner, rollouts))
    with pytest.raises(WeightSyncError, match="not serving the learner's weights"):
        check_canary(engine, learner.scorer.sequence_logprobs, canary, tol)
    engine.load_weights(learner.policy.named_weights())  # and a real sync mends it
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, tol) <= tol


def test_a_missed_sync_is_caught_whatever_the_tolerance(parts):
    """The engine's canary logprobs must move when the learner's do. With a tolerance too wide to see
    any difference (bf16's kernel noise forces a wide one: docs/precision.md), a missed sync is
    still caught; checks with nothing changed on either side, and an honest sync, pass."""
    cfg, learner, engine = parts
    engine.load_weights(learner.policy.named_weights())
    canary = Canary(canary_sequence(render(learner.policy.tokenizer, PROMPTS[0]), [5, 6, 7, 8], engine.block_size(), 1024),
                    float("inf"))
    canary.check(engine, learner.scorer.sequence_logprobs)
    canary.check(engine, learner.scorer.sequence_logprobs)  # the same weights on both sides: bit-for-bit the same
    learner.step(_batch(learner, _generate(learner, engine, seed=21)))
    engine.load_weights(learner.policy.named_weights())
    canary.check(engine, learner.scorer.sequence_logprobs)  # an honest sync
    learner.step(_batch(learner, _generate(learner, engine, seed=22)))
    with pytest.raises(WeightSyncError, match="did not reach the engine"):
        canary.check(engine, learner.scorer.sequence_logprobs)  # the update the engine never heard of
    engine.load_weights(learner.policy.named_weights())
    canary.check(engine, learner.scorer.sequence_logprobs)


def test_the_engine_holds_exactly_the_weights_sent(parts):
    """The digest of each tensor as sent equals that of the engine's own copy, which vLLM on CPU keeps
    packed for its GEMM (read back through it): every tensor of the model, the fused qkv and gate/up
    ones included. A tensor damaged on its way is named, so is one the sync left out; a sync after a
    real update passes; a reload that skips the prefix-cache reset is caught by what the cache served."""
    cfg, learner, engine = parts
    engine.load_weights(learner.policy.named_weights())
    canary = Canary(canary_sequence(render(learner.policy.tokenizer, PROMPTS[0]), [5, 6, 7, 8], engine.block_size(), 1024),
                    float("inf"))  # the logprob checks cannot fail here: only the exact ones can
    canary.expect(learner.policy.named_weights())
    canary.check(engine, learner.scorer.sequence_logprobs)
    assert canary.fingerprinted == {name for name, _ in learner.policy.named_weights()}

    def sync(damage=None, lost=False, unsent=False):
        weights = ((n, t) for n, t in learner.policy.named_weights() if not (unsent and n == DAMAGED))
        engine.load_weights((name, damage(t) if damage and name == DAMAGED else t)
                            for name, t in canary.watch(weights) if not (lost and name == DAMAGED))
        canary.check(engine, learner.scorer.sequence_logprobs)

    learner.step(_batch(learner, _generate(learner, engine, seed=31)))
    sync()
    copy_differs = f"engine's copy of {DAMAGED} is not what the learner sent"
    with pytest.raises(WeightSyncError, match=copy_differs):
        sync(damage=lambda t: torch.cat([t[:1] + 1e-3, t[1:]]))  # a row: in every window
    sync()
    columns = learner.policy.model.state_dict()[DAMAGED].shape[1]
    assert columns > fingerprint.WIDTH  # the window moves: one damaged entry is seen when it reaches its column
    with pytest.raises(WeightSyncError, match=copy_differs):
        for _ in range(columns // fingerprint.WIDTH):
            sync(damage=lambda t: t.index_put((torch.tensor([3]), torch.tensor([columns - 1])), torch.tensor(0.5)))
    sync()
    learner.step(_batch(learner, _generate(learner, engine, seed=32)))
    with pytest.raises(WeightSyncError, match=copy_differs):
        sync(lost=True)  # sent, never loaded: the engine keeps the copy from before the update
    with pytest.raises(WeightSyncError, match=f"did not pass {DAMAGED} to the engine"):
        sync(unsent=True)
    sync()
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(learner.policy.named_weights()),
                                                        "is_checkpoint_format": True})
    canary.expect(learner.policy.named_weights())
    with pytest.raises(WeightSyncError, match="tokens of the canary sequence from its prefix cache"):
        canary.check(engine, learner.scorer.sequence_logprobs)
    sync()


def test_a_stale_prefix_cache_is_caught(parts):
    """New weights loaded without the prefix-cache reset: the canary's own prompt logprobs match (vLLM
    never reads the prefix cache for them), but a continuation of the canary reads the KV cached under
    the old weights, as a rollout of a repeated prompt would, and the check stops the run."""
    cfg, learner, engine = parts
    canary = canary_sequence(render(learner.policy.tokenizer, PROMPTS[1]), [9, 10], engine.block_size(), 1024)
    assert len(canary) > engine.block_size()  # at least one whole block is cached
    tol = CANARY_TOL["float32"]
    engine.load_weights(learner.policy.named_weights())
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, tol) <= tol  # caches the canary's KV
    learner.step(_batch(learner, _generate(learner, engine, seed=7)))
    # The sync without its reset (the fault, caused for real on the real engine):
    engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(learner.policy.named_weights()),
                                                        "is_checkpoint_format": True})
    prompt_only = (engine.sequence_logprobs(canary) - learner.scorer.sequence_logprobs(canary)).abs().max().item()
    assert prompt_only <= tol  # what the canary checked before: blind to the stale cache
    with pytest.raises(WeightSyncError, match="not serving the learner's weights"):
        check_canary(engine, learner.scorer.sequence_logprobs, canary, tol)
    engine.load_weights(learner.policy.named_weights())  # the reset mends it
    assert check_canary(engine, learner.scorer.sequence_logprobs, canary, tol) <= tol


def test_every_sample_of_a_step_has_its_own_random_stream(parts):
    """vLLM seeds sample j of a request with the request's seed + j; with 8 copies of one prompt, sample
    (i, j) and (i + 1, j - 1) would share their noise, and their tokens, if requests were seeded seed + i."""
    _, learner, engine = parts
    same = [PROMPTS[0]] * 8
    rollouts = engine.generate(same, [render(learner.policy.tokenizer, p) for p in same], n=8, seed=11)
    ids = [[rollouts[i * 8 + j].completion_ids for j in range(8)] for i in range(8)]
    assert all(ids[i][j] != ids[i + 1][j - 1] for i in range(7) for j in range(1, 8))
    assert len({tuple(x) for row in ids for x in row}) == 64


def test_an_engine_failure_names_the_step_and_the_request(parts):
    _, learner, engine = parts
    too_long = [5] * 1100  # the engine's max_model_len is 1024: vLLM itself rejects the request
    with pytest.raises(EngineError, match=r"failed at step 7 on 1 prompts x 2 samples \(first prompt: 'What is 12"):
        engine.generate(PROMPTS[:1], [too_long], n=2, seed=0, context="at step 7")
    assert len(_generate(learner, engine)) == 8  # and the engine still serves the next request


def test_seeded_groups_of_long_prompts_generate(parts):
    """Prompts that together exceed one engine step's token budget: with chunked prefill, vLLM would
    split a prefill and rewind its seeded CPU generator, which fails ("CPU Generator does not use offset")."""
    _, learner, engine = parts
    long = [Prompt(messages=[{"role": "user", "content": f"{i} " + "seven times twelve " * 70}], answer="84")
            for i in range(12)]
    ids = [render(learner.policy.tokenizer, p) for p in long]
    assert sum(map(len, ids)) > 8192 and max(map(len, ids)) < 1024 - 16
    rollouts = engine.generate(long, ids, n=2, seed=3)
    assert len(rollouts) == 24 and all(r.completion_ids for r in rollouts)
