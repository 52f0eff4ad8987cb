"""Mixed precision: what `auto` picks and says, float32 masters under bf16 compute, and a bf16-mixed
run end to end with a bf16 engine on the tiny model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rlvr.learner import Learner, precision

from .conftest import compose_config, run_cli
from .test_learner import _batch


@pytest.mark.parametrize("device, flags, expected", [
    ("cuda", [], "bf16-mixed"),
    ("cpu", ["avx512_bf16"], "bf16-mixed"),
    ("cpu", ["amx_bf16"], "bf16-mixed"),
    ("cpu", [], "fp32"),
])
def test_auto_picks_bf16_where_the_hardware_has_it(monkeypatch, device, flags, expected):
    # The CPU's flags are the one thing a test cannot change for real.
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: flags)
    p = precision.resolve("auto", "auto", None, device)
    assert p.learner == expected
    assert p.engine_dtype == ("bfloat16" if expected == "bf16-mixed" else "float32")
    assert p.canary_tol == precision.CANARY_TOL[p.engine_dtype]
    assert p.why.startswith("auto: ") and (device.upper() in p.why or flags[0] in p.why)


def test_explicit_settings_win_and_bf16_without_the_unit_warns(monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    p = precision.resolve("bf16-mixed", "float32", 0.05, "cpu")
    assert (p.learner, p.engine_dtype, p.canary_tol) == ("bf16-mixed", "float32", 0.05)
    assert "bf16 is emulated here and will be slower" in caplog.text


def test_bf16_mixed_keeps_float32_masters_and_computes_in_bf16(cache_dir, tiny_path):
    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.max_tokens=12"], cache_dir)
    mixed = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature, cfg.rollout.max_tokens,
                    "cpu", precision.resolve("bf16-mixed", "auto", None, "cpu"))
    full = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, cfg.rollout.temperature, cfg.rollout.max_tokens,
                   "cpu", precision.resolve("fp32", "auto", None, "cpu"))
    batch = _batch()
    logp_mixed, logp_full = mixed.scorer.batch_logprobs(batch), full.scorer.batch_logprobs(batch)
    assert logp_mixed.dtype == torch.float32
    gap = ((logp_mixed - logp_full) * batch.loss_mask).abs().max().item()
    assert 1e-4 < gap < 0.1  # computed in bf16 (not float32), and close to it
    assert mixed.tis_cap == 2.0 and full.tis_cap is None  # the larger bf16 mismatch is corrected by default
    before = {k: v.clone() for k, v in mixed.policy.named_weights()}
    stats = mixed.step(batch)
    assert stats["learn/skipped_updates"] == 0
    assert all(p.dtype == torch.float32 for p in mixed.policy.model.parameters())
    assert all(s.dtype == torch.float32 for st in mixed.optimizer.state.values() for s in st.values()
               if torch.is_tensor(s) and s.numel() > 1)
    # float32 masters take updates smaller than a bf16 ulp: AdamW on bf16 weights would lose them.
    changed = sum((v != before[k]).sum().item() for k, v in mixed.policy.named_weights())
    assert changed > 0.9 * sum(v.numel() for v in before.values())
    assert all(v.dtype == torch.bfloat16 for _, v in mixed.policy.named_weights(torch.bfloat16))


@pytest.mark.slow
def test_a_bf16_mixed_run_trains_with_a_bf16_engine(tmp_path, cache_dir, tiny_path):
    run_dir = tmp_path / "run"
    result = run_cli(["train", "+experiment=multiplication", "model=tiny", "data.batch_size=2", "algorithm.group_size=4",
                      "rollout.max_tokens=16", "data.eval_size=4", "reward=digits", "optim.lr=1e-3",
                      "trainer.max_steps=2", "learner.precision=bf16-mixed", f"hydra.run.dir={run_dir}"],
                     cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["precision"]["learner"] == "bf16-mixed" and manifest["precision"]["engine_dtype"] == "bfloat16"
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "time/step_s" in x]
    assert len(steps) == 2 and all(s["grad_norm"] > 0 for s in steps)
    # the bf16 engine samples what the learner scores: mismatch above float32 noise, within the bf16 canary
    assert all(1e-4 < s["sync/logprob_max_diff"] for s in steps)
    assert "precision: learner bf16-mixed, engine bfloat16" in (run_dir / "train.log").read_text()
    # learner.compile=auto compiles the decoder layers under bf16-mixed on the CPU (where g++ is there)
    assert manifest["compiled"] is (shutil.which("g++") is not None)
    # the float32 checkpoint cast to the bf16 engine's dtype is what was asked for: no line per weight
    assert "Attempted to load weight" not in result.stdout + result.stderr


@pytest.mark.slow
def test_a_bf16_engine_serving_weights_corrupted_before_the_sync_is_caught(cache_dir, tiny_path):
    """Weights corrupted on the learner's side before their digests are taken (layers swapped by a wrong
    name map): the engine holds exactly what was sent and the bf16 tolerance (8 nats at the largest
    position) lets it through; the mean difference against the learner's own rounding (its float32
    logprobs against bf16) stops it. Honest syncs after real updates pass."""
    from rlvr.learner import Learner, make_batch
    from rlvr.learner.precision import resolve
    from rlvr.prompts import render
    from rlvr.records import Prompt
    from rlvr.rollout.engine import Canary, WeightSyncError, canary_sequence
    from rlvr.rollout.vllm_engine import VllmEngine

    cfg = compose_config(["model=tiny", "optim.lr=1e-2", "rollout.max_tokens=16", "learner.precision=bf16-mixed",
                          "learner.compile=false"], cache_dir)
    precision = resolve("bf16-mixed", "bfloat16", None, "cpu")
    torch.manual_seed(0)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 16, "cpu", precision)
    engine = VllmEngine(tiny_path, cfg.rollout, "bfloat16", seed=0, device="cpu", cache_dir=cache_dir)
    prompts = [Prompt(messages=[{"role": "user", "content": f"What is {a} * 7?"}], answer="") for a in (12, 3456)]
    ids = [render(learner.policy.tokenizer, p) for p in prompts]
    sequence = canary_sequence(ids[0], [5, 6, 7, 8], engine.block_size(), 1024)
    checked, unchecked = Canary(sequence, precision.canary_tol, drift=True), Canary(sequence, precision.canary_tol)
    try:
        for step in range(2):
            batch = make_batch(engine.generate(prompts, ids, n=4, seed=step), learner.policy.pad_id)
            batch.advantages = torch.tensor([1.0, -1.0] * 4)
            learner.step(batch)
            engine.load_weights(learner.policy.named_weights(torch.bfloat16))
            checked.check(engine, learner.scorer.sequence_logprobs)  # honest
        weights = dict(learner.policy.named_weights(torch.bfloat16))
        first, last = "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"
        weights[first], weights[last] = weights[last], weights[first]
        engine.load_weights(unchecked.watch(weights.items()))
        assert unchecked.check(engine, learner.scorer.sequence_logprobs) < precision.canary_tol  # passed before
        engine.load_weights(checked.watch(weights.items()))
        with pytest.raises(WeightSyncError, match="times what rounding alone moves the learner's own"):
            checked.check(engine, learner.scorer.sequence_logprobs)
    finally:
        engine.close()
