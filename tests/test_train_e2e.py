"""`rlvr train` end to end, as a user runs it: the real CLI, the real vLLM CPU engine, model=tiny."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlvr.learner import token_logprobs

from .conftest import run_cli

pytestmark = pytest.mark.slow

SMALL = ["+experiment=multiplication", "model=tiny", "data.batch_size=2", "algorithm.group_size=4",
         "rollout.max_tokens=16", "data.eval_size=4"]


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_steps_train_sync_and_write_every_output(tmp_path, cache_dir, tiny_path):
    run_dir = tmp_path / "run"
    result = run_cli(["train", *SMALL, "reward=digits", "optim.lr=1e-3", "trainer.max_steps=2",
                      "logger=wandb", "logger.mode=offline", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]

    records = _metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 2]  # eval before, two steps, eval after
    assert "eval/accuracy" in records[0] and "eval/accuracy" in records[-1]
    for r in records[1:3]:
        for key in ["reward/mean", "reward/digits", "accuracy", "completion_len/mean", "loss", "kl", "clip_frac",
                    "grad_norm", "time/rollout_s", "time/reward_s", "time/learn_s", "time/sync_s", "time/step_s",
                    "sync/logprob_max_diff", "tokens_per_s"]:
            assert key in r, key
        assert r["grad_norm"] > 0
        assert r["sync/logprob_max_diff"] <= 1e-3  # the engine served the learner's new weights

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["versions"]["vllm"] == "0.32.0" and manifest["versions"]["torch"].startswith("2.13.0")
    assert manifest["seed"] == 0 and manifest["model_path"] == str(tiny_path)
    assert "lr: 0.001" in (run_dir / "config.yaml").read_text()
    assert list((run_dir / "wandb").glob("offline-run-*"))

    # The final model is a Hugging Face folder with different weights from the start.
    before, after = load_file(tiny_path / "model.safetensors"), load_file(run_dir / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # ... that transformers and vLLM load as is, and agree on.
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.engine import RolloutEngine
    from tests.conftest import compose_config

    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    ids = list(range(5, 25))
    with torch.no_grad():
        expected = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
    cfg = compose_config(["model=tiny"], cache_dir)
    engine = RolloutEngine(run_dir / "model", cfg.rollout, "float32", 0, "cpu", cache_dir)
    try:
        assert (engine.sequence_logprobs(ids) - expected).abs().max().item() < 1e-3
    finally:
        engine.close()


def test_multirun_makes_one_run_dir_per_value(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli(["train", "-m", *SMALL, "trainer.max_steps=1", "trainer.save_model=false",
                      "optim.lr=1e-5,1e-6", f"hydra.sweep.dir={sweep}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists())
    assert [p.name for p in runs] == ["0", "1"]
    assert ["lr: 1.0e-05" in (p / "config.yaml").read_text() for p in runs] == [True, False]
    for p in runs:
        assert [r["step"] for r in _metrics(p)] == [0, 1, 1]
