"""Preference tuning (`rlvr.preference`, `preference_loss`): DPO's and SimPO's losses on numbers derived
by hand, pairs never split across micro-batches, pairs ranked by the verifier, pairs from a dataset
refused clearly when malformed, and the `dpo` stage of a recipe end to end on the real engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlvr.algorithms.losses import Normaliser
from rlvr.algorithms.objective import Preference, PreferenceConfig, preference_loss
from rlvr.preference import ranked_pairs
from rlvr.records import Prompt, Rollout

from .conftest import cli_here, compose_config, run_cli

LN = math.log

# Two pairs (rows: chosen, rejected, chosen, rejected) of up to two answer tokens; -9 marks padding.
MASK = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
POLICY = torch.log(torch.tensor([[0.5, 0.9], [0.25, 0.9], [0.5, 0.5], [0.25, 0.9]]))
REF = torch.log(torch.tensor([[0.25, 0.9], [0.5, 0.9], [0.5, 0.5], [0.25, 0.9]]))
NORM = Normaliser(tokens=5, sequences=4, max_tokens=2)


def test_dpo_is_minus_log_sigmoid_of_beta_times_the_log_ratio_margin():
    # pair 0: chosen log(0.5 / 0.25) = ln 2, rejected log(0.25 / 0.5) = -ln 2: margin beta * 2 ln 2 = ln 2
    #   at beta 0.5 -> -log sigmoid(ln 2) = -log(2/3) = ln 1.5
    # pair 1: policy equals the reference on both: margin 0 -> ln 2
    # mean over the batch's 2 pairs: (ln 1.5 + ln 2) / 2
    policy = POLICY.clone().requires_grad_()
    loss, stats = preference_loss(policy, MASK, REF, PreferenceConfig("dpo", 0.5), NORM)
    assert float(loss) == pytest.approx((LN(1.5) + LN(2)) / 2)
    assert stats.pairs == 2 and stats.ordered == 1 and stats.margin == pytest.approx(LN(2))
    assert stats.chosen == pytest.approx(0.5 * LN(2)) and stats.rejected == pytest.approx(-0.5 * LN(2))
    loss.backward()
    # d/d(chosen logprob) of pair 0: -(1 - sigmoid(ln 2)) * beta / 2 pairs = -(1/3) * 0.5 / 2 = -1/12;
    # of pair 1 (margin 0): -(1/2) * 0.5 / 2 = -1/8, on each of the chosen's two tokens; padding gets 0
    assert policy.grad[0].tolist() == pytest.approx([-1 / 12, 0.0])
    assert policy.grad[1].tolist() == pytest.approx([1 / 12, 0.0])
    assert policy.grad[2].tolist() == pytest.approx([-1 / 8, -1 / 8])


def test_simpo_takes_the_mean_token_logprob_less_a_margin_and_no_reference():
    # beta 2, gamma 0.5. pair 0: chosen 2 * ln 0.5 = -2 ln 2, rejected 2 * ln 0.25 = -4 ln 2 -> margin 2 ln 2
    # pair 1: chosen mean (ln 0.5 + ln 0.5) / 2 = -ln 2 -> -2 ln 2, rejected 2 ln 0.25 = -4 ln 2 -> 2 ln 2
    # each: -log sigmoid(ln 4 - 0.5) = log(1 + e^0.5 / 4)
    loss, stats = preference_loss(POLICY, MASK, None, PreferenceConfig("simpo", 2.0, 0.5), NORM)
    assert float(loss) == pytest.approx(LN(1 + math.exp(0.5) / 4))
    assert stats.ordered == 2 and stats.margin == pytest.approx(2 * LN(4))


def test_the_losses_of_a_batch_s_pairs_add_up_to_the_batch_loss():
    cfg = PreferenceConfig("dpo", 0.5)
    whole, _ = preference_loss(POLICY, MASK, REF, cfg, NORM)
    halves = [preference_loss(POLICY[k : k + 2], MASK[k : k + 2], REF[k : k + 2], cfg, NORM)[0] for k in (0, 2)]
    assert float(sum(halves)) == pytest.approx(float(whole))


def test_dpo_without_the_reference_s_logprobs_is_refused():
    with pytest.raises(ValueError, match="reference"):
        preference_loss(POLICY, MASK, None, PreferenceConfig("dpo"), NORM)


def _rollouts(texts: list[str]) -> list[Rollout]:
    return [Rollout(Prompt([], ""), 0, [1], [k], [0.0], t, "stop") for k, t in enumerate(texts)]


@pytest.mark.parametrize("scores, most, pairs", [
    ([[1, 0, 1, 0]], 4, [("a", "d"), ("c", "b")]),  # right answers with wrong ones (ties: first sampled ranks first)
    ([[1, 1, 1, 1]], 4, []),  # all alike: no signal, no pair
    ([[0.5, 0, 1, 0.2]], 4, [("c", "b"), ("a", "d")]),  # graded scores: best with worst, then the next two
    ([[1, 0, 0, 0]], 4, [("a", "d")]),  # one right answer: one pair (the second pair would be 0 against 0)
    ([[1, 0, 1, 0]], 1, [("a", "d")]),  # at most `most` a group
    ([[1, 0, 0, 0], [0, 0, 0, 1]], 4, [("a", "d"), ("h", "g")]),  # each group on its own rollouts
])
def test_the_verifier_ranks_on_policy_pairs(scores, most, pairs):
    texts = "abcdefgh"[: 4 * len(scores)]
    out = ranked_pairs(_rollouts(list(texts)), torch.tensor(scores, dtype=torch.float), most)
    assert [(c.text, r.text) for c, r in out] == pairs


def _pair_batch(learner, pairs: int = 3, seed: int = 0):
    from rlvr.learner import make_batch

    gen = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(pairs):
        prompt = torch.randint(3, 200, (5,), generator=gen).tolist()
        for _ in range(2):
            answer = torch.randint(3, 200, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen).tolist()
            rows.append(Rollout(Prompt([], ""), k, prompt, answer, [0.0] * len(answer), "", "stop"))
    return make_batch(rows, learner.policy.pad_id)


def _dpo_learner(cache_dir, tiny_path, micro: int):
    from rlvr.learner import Learner

    cfg = compose_config(["model=tiny", f"learner.micro_batch_size={micro}", "optim.lr=1e-2"], cache_dir)
    torch.manual_seed(0)
    return Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 8, "cpu", with_reference=True)


def test_a_dpo_step_keeps_each_pair_in_one_micro_batch_and_moves_the_policy_from_its_reference(cache_dir, tiny_path):
    """Micro-batches of 3 rows (odd: a pair would straddle two) give the step of micro-batches of 6: a pair
    is never split. At the first step the policy is its reference: the loss is ln 2 and no pair is ordered;
    after it, the chosen answers gained on the rejected ones."""
    objective = Preference(PreferenceConfig("dpo", 0.5))
    odd, whole = _dpo_learner(cache_dir, tiny_path, 3), _dpo_learner(cache_dir, tiny_path, 6)
    batch = _pair_batch(odd)
    a, b = odd.step(batch, objective), whole.step(batch, objective)
    assert a["loss"] == pytest.approx(LN(2), rel=1e-5) and a["pref/accuracy"] == 0.0
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    after = odd.step(batch, objective)
    assert after["loss"] < a["loss"] and after["pref/accuracy"] == 1.0 and after["pref/margin"] > 0


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


TINY = ["+experiment=multiplication", "model=tiny", "data.eval_size=4", "rollout.max_tokens=16",
        "learner.precision=fp32"]


@pytest.mark.parametrize("row, error", [
    ({"prompt": "2 * 3?", "chosen": "6"}, "line 1: no column 'rejected' (dpo.rejected_key)"),
    ({"prompt": "2 * 3?", "chosen": "6", "rejected": 5}, "'rejected' must be a string or a list of messages"),
    ({"chosen": [{"role": "user", "content": "2 * 3?"}, {"role": "assistant", "content": "6"}],
      "rejected": [{"role": "user", "content": "2 * 4?"}, {"role": "assistant", "content": "8"}]},
     "answer different prompts"),
    ({"prompt": "2 * 3?", "chosen": "6", "rejected": [{"role": "user", "content": "7"}]},
     "'rejected': no assistant message"),
])
def test_bad_pairs_fail_before_the_model_loads_naming_the_row(row, error, tmp_path, cache_dir):
    data = _write(tmp_path / "pairs.jsonl", [row])
    result = cli_here(["train", *TINY, "recipe=[dpo]", "dpo.steps=1", f"dpo.data={data}",
                       f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1 and error in result.stderr, result.stderr[-2000:]
    assert "dpo.data=" in result.stderr


@pytest.mark.parametrize("args, error", [
    (["dpo.steps=2"], "dpo.steps=2 asks for a preference stage, but recipe=[rl] does not list it: add it "
                      "(e.g. recipe=[dpo,rl])"),
    (["sft.steps=2"], "sft.steps=2 asks for a cold start, but recipe=[rl] does not list it: add it (e.g. "
                      "recipe=[sft,rl])"),
    (["recipe=[dpo,rl]"], "dpo.steps: recipe=[dpo,rl] runs the preference stage, which needs dpo.steps >= 1"),
    (["recipe=[rl,ppo]"], "recipe: must list stages, each one of sft, dpo, rl"),
    (["recipe=[dpo]", "dpo.steps=1", "dpo.loss=ipo"], "dpo.loss: must be one of dpo, simpo"),
])
def test_a_recipe_that_cannot_run_is_refused_naming_the_key(args, error, tmp_path, cache_dir):
    result = cli_here(["train", *TINY, *args, f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1 and error in result.stderr, result.stderr[-2000:]


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "time/step_s" in r]


@pytest.mark.slow
def test_dpo_from_a_dataset_of_pairs_learns_them_and_the_engine_serves_the_result(tmp_path, cache_dir):
    """Four pairs in TRL's conversational format, shown every step: the policy comes to prefer the chosen
    answers (pref/accuracy 0 at the first step, where it is its own reference, then 1) and the loss falls
    below ln 2; the engine takes the weights before each evaluation and serves them exactly."""
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * {b}?"}],
             "chosen": [{"role": "assistant", "content": f"<answer>{a * b}</answer>"}],
             "rejected": [{"role": "assistant", "content": f"<answer>{a * b + 1}</answer>"}]}
            for a, b in [(12, 34), (56, 71), (81, 93), (27, 45)]]
    data = _write(tmp_path / "pairs.jsonl", rows)
    run_dir = tmp_path / "run"
    result = run_cli(["train", *TINY, "recipe=[dpo]", "dpo.steps=4", f"dpo.data={data}", "dpo.batch_size=4",
                      "dpo.lr=1e-3", "dpo.beta=0.5", "dpo.eval_every=2", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[0]["loss"] == pytest.approx(LN(2), rel=1e-4) and steps[0]["pref/accuracy"] == 0.0
    assert steps[-1]["loss"] < 0.5 * LN(2) and steps[-1]["pref/accuracy"] == 1.0
    synced = [s for s in steps if "sync/logprob_max_diff" in s]
    assert [s["step"] for s in synced] == [2, 4] and all(s["sync/logprob_max_diff"] < 1e-3 for s in synced)
    assert (run_dir / "model" / "config.json").is_file()


@pytest.mark.slow
def test_the_recipe_runs_sft_then_on_policy_dpo_then_rl_each_from_the_last_s_model(tmp_path, cache_dir):
    """recipe=[sft,dpo,rl]: the cold start into <run dir>/sft, on-policy DPO from its model into
    <run dir>/dpo (pairs the verifier ranks, the engine synced every step), RL from the DPO model in the
    run dir; killed in the DPO stage, the same command with trainer.resume=auto finds the cold start
    done and finishes the rest, each step run once."""
    import os
    import signal

    from .test_checkpoint import _start, _wait_for_step

    run_dir = tmp_path / "run"
    args = [*TINY, "recipe=[sft,dpo,rl]", "sft.steps=4", "sft.batch_size=8", "sft.lr=3e-3", "sft.warmup_steps=0",
            "dpo.steps=4", "dpo.lr=1e-4", "dpo.save_every=1", "data.batch_size=2", "algorithm.group_size=4",
            "reward=digits", "trainer.max_steps=2", "optim.lr=1e-4", f"hydra.run.dir={run_dir}"]
    proc = _start(args, cache_dir)
    _wait_for_step(proc, run_dir / "dpo", 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    result = run_cli(["train", *args, "trainer.resume=auto"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cold start: done already" in result.stderr
    dpo = _steps(run_dir / "dpo")
    assert [s["step"] for s in dpo] == [1, 2, 3, 4]
    assert all("sync/logprob_max_diff" in s and s["sync/logprob_max_diff"] < 1e-3 for s in dpo)
    assert all("pref/pairs" in s and "reward/mean" in s for s in dpo)
    assert sum(s["pref/pairs"] for s in dpo) > 0  # the verifier ranked some answers apart
    assert [s["step"] for s in _steps(run_dir)] == [1, 2]
    assert json.loads((run_dir / "dpo" / "manifest.json").read_text())["model_path"] == str(run_dir / "sft" / "model")
    assert json.loads((run_dir / "manifest.json").read_text())["model_path"] == str(run_dir / "dpo" / "model")
    assert (run_dir / "model" / "config.json").is_file()
