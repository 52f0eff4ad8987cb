"""Mixtures (`data=mixture`, rlvr.data.mixture): each source's prompts scored by its own terms, drawn in
its share, evaluated on its own; the config errors of a mixture name the source's key; and one real run
of a mixture through the CLI on the tiny model, killed by nothing but checked for its per-source curves
and its checkpoint's per-source state."""

from __future__ import annotations

import json
import random

import pytest

from rlvr.config import check
from rlvr.data import build_task
from rlvr.data.mixture import Mixture
from rlvr.errors import ConfigError
from rlvr.keys import unknown_keys
from rlvr.metrics import summarise
from rlvr.records import Rollout
from rlvr.rewards import build_rewards

from .conftest import cli_here, compose_config, compose_dictconfig, run_cli

MIX = ["+experiment=mixture"]


def _rollout(prompt, text: str, group: int = 0) -> Rollout:
    return Rollout(prompt=prompt, group=group, prompt_ids=[], completion_ids=[], sampler_logprobs=[], text=text,
                   finish_reason="stop")


def _right(prompt) -> str:
    """A completion the prompt's own verifier accepts."""
    if prompt.meta["domain"] == "function_picking":
        return f"<answer>{json.loads(prompt.answer)['name']}</answer>"
    return f"<answer>{prompt.answer}</answer>"


def test_each_source_is_scored_by_its_own_terms_and_its_own_correct_term():
    cfg = compose_config(MIX)
    task, rewards = build_task(cfg), build_rewards(cfg)
    by = {p.meta["domain"]: p for p in task.eval_prompts()}
    mul, fp = by["multiplication"], by["function_picking"]
    G = 2
    # a group of each source: one right answer, one the other source's right answer (wrong here)
    rollouts = [_rollout(mul, _right(mul)), _rollout(mul, _right(fp)), _rollout(fp, _right(fp)), _rollout(fp, _right(mul))]
    rewards.score(rollouts)
    assert set(rollouts[0].rewards) == {"multiplication/correct", "multiplication/format"}
    assert set(rollouts[2].rewards) == {"function_picking/call", "function_picking/name", "function_picking/format"}
    assert [rewards.is_correct(r) for r in rollouts] == [True, False, True, False]
    scores = rewards.scores(rollouts, G)
    # multiplication: correct + 0.2 format; function picking: call + 0 name + 0.2 format (each its own weights)
    assert scores[0].tolist() == pytest.approx([1.2, rollouts[1].reward])
    assert scores[1].tolist() == pytest.approx([1.2, rollouts[3].reward])
    metrics = summarise(rollouts, rewards)
    assert metrics["multiplication/accuracy"] == 0.5 and metrics["function_picking/accuracy"] == 0.5
    assert metrics["reward/multiplication/correct"] == 0.5  # over multiplication's rollouts only
    assert rewards.correct_terms == {"multiplication/correct", "function_picking/call"}


def test_sources_are_drawn_in_their_shares_and_resume_where_they_were():
    cfg = compose_config([*MIX, "data.sources.multiplication.weight=3", "data.sources.function_picking.weight=1"])
    task = build_task(cfg)
    drawn = [p.meta["domain"] for _ in range(100) for p in task.sample(8)]
    assert drawn.count("multiplication") / len(drawn) == pytest.approx(0.75, abs=0.03)
    state = json.loads(json.dumps(task.state_dict()))  # as a checkpoint keeps it
    after = [(p.answer, p.meta["domain"]) for p in task.sample(8)]
    again = build_task(cfg)
    again.load_state_dict(state)
    assert [(p.answer, p.meta["domain"]) for p in again.sample(8)] == after
    assert {p.meta["domain"] for p in task.eval_prompts()} == {"multiplication", "function_picking"}
    held = {p.messages[-1]["content"] for p in task.eval_prompts()}
    assert not held & {p.messages[-1]["content"] for p in task.sample(64)}


def test_each_source_gets_its_own_accuracy_for_its_curriculum():
    """A source's curriculum (multiplication's levels) advances on its own accuracy of the step's first
    round, not on the mixture's."""
    cfg = compose_config([*MIX, "data.sources.multiplication.data.levels=[[1,1],[2,2]]",
                          "data.sources.multiplication.data.advance_at=0.9", "data.sources.multiplication.data.window=1"])
    task: Mixture = build_task(cfg)
    prompts = task.sample(8)
    rates = [1.0 if p.meta["domain"] == "multiplication" else 0.0 for p in prompts]
    task.observe(prompts, rates, step=1)
    task.observe(prompts, [0.0] * len(prompts), step=1)  # a later round of the same step: not the first round
    task.update(sum(rates) / len(rates))  # the mixture's accuracy is below 0.9; multiplication's is 1.0
    assert task.metrics()["multiplication/curriculum/level"] == 1.0


@pytest.mark.parametrize("overrides, message", [
    (["data=mixture"], "data.sources: a mixture needs at least one source"),
    ([*MIX, "data.sources.function_picking.weight=0"], "data.sources.function_picking.weight: must be > 0"),
    ([*MIX, "data.sources.multiplication.reward.correct_term=right"],
     "data.sources.multiplication.reward.correct_term: names the term that defines accuracy"),
    ([*MIX, "data.sources.multiplication.data.eval_size=0"], "data.sources.multiplication.data.eval_size: must be >= 1"),
    ([*MIX, "data.sources.multiplication.reward.terms.correct.weight=heavy"],
     "data.sources.multiplication.reward.terms.correct.weight: must be a number"),
    ([*MIX, "data.sources.multiplication.data.sampling.mode=difficulty"],
     "data.sources.multiplication.data.sampling.mode: a mixture draws by difficulty as a whole"),
])
def test_a_bad_mixture_is_refused_naming_the_sources_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        check(compose_config(overrides))


def test_a_misspelt_key_of_a_source_is_named_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.sources\.multiplication\.reward\.terms\.correct\.wieght: no such key"):
        unknown_keys(compose_dictconfig([*MIX, "+data.sources.multiplication.reward.terms.correct.wieght=2"]))
    result = cli_here(["train", *MIX, "data.sources.multiplication.data.levelz=[[1,1]]",
                       f"hydra.run.dir={tmp_path / 'run'}"], cache=tmp_path)
    assert result.returncode != 0 and "levelz" in result.stderr and "Traceback" not in result.stderr


def test_the_two_sources_state_and_draws_repeat_for_a_seed():
    a, b = (build_task(compose_config([*MIX, "seed=3"])) for _ in range(2))
    assert [p.answer for p in a.sample(16)] == [p.answer for p in b.sample(16)]
    random.seed(0)  # (the mixture's draw is its own, whatever the global generator does)
    assert [p.answer for p in a.sample(16)] == [p.answer for p in b.sample(16)]


@pytest.mark.slow
def test_a_mixture_trains_with_per_source_curves_and_checkpoints(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = run_cli(["train", *MIX, "model=tiny", "recipe=[rl]", "sft.steps=0", "data.batch_size=4",
                      "algorithm.group_size=2", "rollout.max_tokens=16", "data.sources.multiplication.data.eval_size=4",
                      "data.sources.function_picking.data.eval_size=4", "data.sampling.mode=difficulty",
                      "trainer.max_steps=2", "trainer.eval_every=1", "trainer.save_every=2", "trainer.save_model=false",
                      "trainer.samples_every=1", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/accuracy" in r]
    assert all({"eval/multiplication/accuracy", "eval/function_picking/accuracy"} <= r.keys() for r in evals)
    steps = [r for r in records if "time/step_s" in r]
    assert {"reward/multiplication/correct", "reward/function_picking/call", "sampling/tracked",
            "rollouts/discarded"} <= steps[0].keys()
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["domain"] in ("multiplication", "function_picking") for s in samples)
    task_state = json.loads(next(run_dir.glob("checkpoints/step-*/trainer_state.json")).read_text())["task"]
    assert set(task_state["task"]["sources"]) == {"multiplication", "function_picking"}
    assert task_state["rates"]  # the pass rates of the prompts drawn, for the resumed run


def test_the_docs_mixture_of_two_files_composes_and_scores_each_with_its_verifier(tmp_path, monkeypatch):
    """docs/tasks.md's own mixture (two JSONL files, the math and exact verifiers) as written."""
    from .test_tasks_e2e import _readme_block

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "my_mix.yaml").write_text(_readme_block("mixture-yaml"))
    for name, answer in (("gsm", "12"), ("sql", "SELECT 1")):
        rows = [{"question": f"{name} question {i}", "answer": answer} for i in range(20)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # (the example's paths are relative to where rlvr runs)
    cfg = compose_config([f"hydra.searchpath=[file://{tmp_path}]", "+experiment=my_mix"])
    check(cfg)
    task, rewards = build_task(cfg), build_rewards(cfg)
    drawn = task.sample(8)
    assert {p.meta["domain"] for p in task.sample(40)} == {"gsm", "sql"}
    rollouts = [_rollout(p, "\\boxed{12}" if p.meta["domain"] == "gsm" else "<answer>SELECT 1</answer>", group=k)
                for k, p in enumerate(drawn)]
    rewards.score(rollouts)
    assert [(r.prompt.meta["domain"], r.rewards) for r in rollouts if not rewards.is_correct(r)] == []
