"""`rlvr train` end to end, as a user runs it: the real CLI, the real vLLM CPU engine, model=tiny."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from rlvr.modeling.logprobs import token_logprobs

from .conftest import RLVR, run_cli

pytestmark = pytest.mark.slow

SMALL = ["+experiment=multiplication", "model=tiny", "data.batch_size=2", "algorithm.group_size=4",
         "rollout.max_tokens=16", "data.eval_size=4"]


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_trains_syncs_and_writes_every_output(golden, tmp_path, cache_dir, tiny_path):
    """The golden run (tests/conftest.py: 6 steps on the tiny model, logger=wandb offline) and what
    `rlvr plot` and `rlvr eval` make of it."""
    run_dir = golden
    records = _metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5, 6, 6]  # eval before, six steps, eval after
    assert "eval/accuracy" in records[0] and "eval/accuracy" in records[-1]
    for r in records[1:7]:
        for key in ["reward/mean", "reward/digits", "accuracy", "completion_len/mean", "loss", "kl", "clip_frac",
                    "grad_norm", "time/rollout_s", "time/reward_s", "time/learn_s", "time/sync_s", "time/step_s",
                    "sync/logprob_max_diff", "tokens_per_s", "entropy/sampled", "learn/tokens"]:
            assert key in r, key
        assert r["entropy/sampled"] > 1.0  # a random tiny model samples from a nearly flat distribution
        assert r["grad_norm"] > 0
        # the engine/learner mismatch of the sequences the learner ran, from step 1 on
        assert r["learn/sequences"] > 0 and r["mismatch/tokens"] > 0 and r["mismatch/logprob_abs_max"] < 1e-3
    # Every second of a step belongs to a named phase; what none names (the step's bookkeeping) is small.
    phases = ["prompts", "rollout", "reward", "learn", "sync", "canary", "other"]
    for r in records[1:7]:
        assert sum(r[f"time/{p}_s"] for p in phases) == pytest.approx(r["time/step_s"])
    assert sum(r["time/other_s"] for r in records[1:7]) < 0.25 * sum(r["time/step_s"] for r in records[1:7])

    # vLLM's harmless start-up warnings are in train.log, not on the console (docs/checkpoints.md, What the console shows)
    console, log = (run_dir.parent / "console.txt").read_text(), (run_dir / "train.log").read_text()
    for harmless in ("LD_PRELOAD", "disabling chunked prefill", "Triton", "reduce_op", "Enforce eager",
                     "torch.distributed is disabled"):  # (torch's, at each checkpoint's optimizer state)
        assert harmless not in console, harmless
    assert "is not found in LD_PRELOAD" in log and "step 6 |" in console

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["versions"]["vllm"] == "0.32.0" and manifest["versions"]["torch"].startswith("2.13.0")
    assert manifest["seed"] == 0 and manifest["model_path"] == str(tiny_path)
    assert "lr: 0.001" in (run_dir / "config.yaml").read_text()
    assert list((run_dir / "wandb").glob("offline-run-*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["wall_s"] > 0 and "eval/accuracy" in summary["final_eval"]

    # `rlvr plot` draws the curves of this run into a PNG (training wrote run_dir/curves.png already).
    own = (run_dir / "curves.png").read_bytes()
    png = tmp_path / "plots" / "one.png"
    plotted = run_cli(["plot", str(run_dir), "--out", str(png)], cache=cache_dir, timeout=120)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # Several runs without --out: a new file in the current directory, named in the output; no run's
    # own curves.png is overwritten.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(run_dir / "metrics.jsonl", other)
    here = tmp_path / "here"
    here.mkdir()
    plotted = subprocess.run([RLVR, "plot", str(run_dir), str(other)], cwd=here, capture_output=True, text=True,
                             timeout=120)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    [png] = here.iterdir()
    assert png.name.startswith("curves-") and str(png.resolve()) in plotted.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (run_dir / "curves.png").read_bytes() == own and not (other / "curves.png").exists()

    # The final model is a Hugging Face folder with different weights from the start.
    before, after = load_file(tiny_path / "model.safetensors"), load_file(run_dir / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # `rlvr eval` on the trained model: greedy accuracy, pass@k, every sample written out (in one process,
    # saying so when asked for more).
    evaluated = run_cli(["eval", *SMALL, "reward=digits", "model=local", f"model.path={run_dir / 'model'}",
                         "eval.n_samples=4", "launch.nproc_per_node=2", f"hydra.run.dir={tmp_path / 'eval'}"],
                        cache=cache_dir)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "rlvr eval runs in one process: launch.nproc_per_node=2" in evaluated.stdout + evaluated.stderr
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    for key in ["eval/accuracy", "eval/pass@1", "eval/pass@4", "eval/mean@4", "eval/reward/digits",
                "eval/completion_len/mean", "eval/truncated_frac"]:
        assert key in report, key
    assert report["eval/pass@1"] == pytest.approx(report["eval/mean@4"])  # pass@1 is the mean accuracy
    samples = [json.loads(x) for x in (tmp_path / "eval" / "eval_samples.jsonl").read_text().splitlines()]
    assert [s["decoding"] for s in samples] == ["greedy"] * 4 + ["sampled"] * 16
    assert "eval/pass@4" in evaluated.stdout  # the printed table

    # samples.jsonl: each step, the groups of the first log_samples (2) prompts, with reward components
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [step for step in range(1, 7) for _ in range(8)]
    assert all("digits" in s["rewards"] and s["completion"] is not None for s in samples)

    # ... and the model folder is one that transformers and vLLM load as is, and agree on.
    from transformers import AutoModelForCausalLM

    from rlvr.rollout.vllm_engine import VllmEngine
    from tests.conftest import compose_config

    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    ids = list(range(5, 25))
    with torch.no_grad():
        expected = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
    cfg = compose_config(["model=tiny"], cache_dir)
    engine = VllmEngine(run_dir / "model", cfg.rollout, "float32", 0, "cpu", cache_dir)
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
    # the sweep summary: one row per run, the differing override named
    rows = (sweep / "sweep_summary.csv").read_text().splitlines()
    assert rows[0].startswith("run,overrides,final_reward,eval_accuracy")
    assert sorted(r.split(",")[1] for r in rows[1:]) == ["optim.lr=1e-05", "optim.lr=1e-06"]
    assert "sweep_summary.csv" in result.stdout + result.stderr
    # the second job's engine: vLLM's kernels registered again, which it says once per kernel (train.log keeps it)
    assert "is already registered" not in result.stdout + result.stderr


def test_every_knob_at_once_runs_end_to_end(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = run_cli(["train", *SMALL, "reward=digits", "optim.lr=1e-3", "trainer.max_steps=2",
                      "trainer.save_model=false", "algorithm=dapo", "algorithm.kl.reward_coef=0.1",
                      "algorithm.overlong.buffer=4", "algorithm.tis_cap=2.0", "algorithm.ppo_epochs=2",
                      "algorithm.mini_batches=2", "algorithm.dual_clip=3.0", f"hydra.run.dir={run_dir}"],
                     cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in _metrics(run_dir) if "time/step_s" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["learn/optimizer_steps"] == 4
        assert r["mismatch/logprob_abs_max"] < 1e-3
    # The KL reward grows as the policy leaves the reference (step 1 samples the reference itself).
    assert steps[1]["kl_reward"] > 10 * steps[0]["kl_reward"]
    # Every completion cut at max_tokens=16 is punished by the full -1 (buffer 4 from 12 tokens on).
    cut = [r for r in steps if r["truncated_frac"] == 1.0]
    assert cut and all(r["reward/overlong"] == pytest.approx(-1.0) for r in cut)
