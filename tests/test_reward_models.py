"""Model-based rewards on tiny models built here: a sequence-classification reward model, and a judge
(its own model, or the policy's engine) taught in a few seconds to answer every question with "7"."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlvr.prompts import render
from rlvr.records import Prompt, Rollout
from rlvr.rewards import RewardError, Rewards
from rlvr.rewards.models import Judge, RewardModel

from .conftest import reward_config

PROMPTS = [Prompt([{"role": "user", "content": f"What is {a} * 7?"}], str(7 * a)) for a in (3, 12, 456)]
COMPLETIONS = ["21", "<answer>84</answer> because 12 * 7 = 84", "I think it is 3190, give or take a few"]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory, tiny_path) -> Path:
    """A random tiny Llama with a one-logit classification head, and the tiny tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_path)
    config.num_labels = 1
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    path = tmp_path_factory.mktemp("reward_model")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(path)
    return path


def test_reward_model_scores_a_batch_as_it_scores_each_alone(reward_model):
    from transformers import AutoModelForSequenceClassification

    rm = RewardModel(str(reward_model), batch_size=2)
    batched = rm(COMPLETIONS, PROMPTS)  # 2 + 1 rows, padded to the longest of each batch
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    for value, c, p in zip(batched, COMPLETIONS, PROMPTS, strict=True):
        ids = rm.tokenizer(rm.text(c, p), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            assert value == pytest.approx(model(**ids).logits[0, 0].item(), abs=1e-5)
    assert len(set(batched)) == 3
    scaled = RewardModel(str(reward_model), scale=2.0, shift=0.5, sigmoid=True)(COMPLETIONS, PROMPTS)
    assert scaled == pytest.approx([2 * 1 / (1 + math.exp(-(v - 0.5))) for v in batched], abs=1e-5)


def _rewards(terms: dict, **extra) -> Rewards:
    return Rewards(reward_config(terms, **{"correct_term": "correct", **extra}))


CORRECT = {"_target_": "rlvr.rewards.answer.numeric_match", "weight": 1.0, "kwargs": {}}


def _rollouts() -> list[Rollout]:
    return [Rollout(prompt=p, group=0, prompt_ids=[], completion_ids=[1], sampler_logprobs=[0.0], text=c,
                    finish_reason="stop") for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]


def test_a_reward_model_term_combines_with_rule_terms_by_weight(reward_model):
    rewards = _rewards({"correct": CORRECT, "rm": {"_target_": "rlvr.rewards.models.RewardModel", "weight": 0.5,
                                                   "kwargs": {"path": str(reward_model)}}})
    rollouts = _rollouts()
    assert rewards.score(rollouts) == 0
    raw = RewardModel(str(reward_model))(COMPLETIONS, PROMPTS)
    for r, value in zip(rollouts, raw, strict=True):
        assert r.rewards["rm"] == pytest.approx(value, abs=1e-5)
        assert r.reward == pytest.approx(r.rewards["correct"] + 0.5 * value, abs=1e-5)
    assert [r.rewards["correct"] for r in rollouts] == [1.0, 1.0, 0.0]
    rewards.close()


@pytest.mark.parametrize("kwargs, shown", [
    ({"path": "tiny"}, "is not a sequence-classification reward model (its architectures: ['LlamaForCausalLM']"),
    ({"path": "/nowhere"}, "is not a model folder")])
def test_a_folder_that_is_no_reward_model_fails_at_start_naming_the_term(kwargs, shown, tiny_path):
    path = str(tiny_path) if kwargs["path"] == "tiny" else kwargs["path"]
    with pytest.raises(RewardError, match=r"reward\.terms\.rm \(rlvr\.rewards\.models\.RewardModel\) cannot start") as e:
        _rewards({"correct": CORRECT, "rm": {"_target_": "rlvr.rewards.models.RewardModel", "kwargs": {"path": path}}})
    assert shown in str(e.value)


@pytest.fixture(scope="module")
def judge_model(tmp_path_factory, tiny_path) -> Path:
    """The tiny model after a few steps of supervised training to reply "7" to judge questions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    judge = Judge()
    rows = []
    for p, c in zip(PROMPTS, COMPLETIONS, strict=True):
        question = render(tok, judge.question(c, p))
        rows.append((question, tok("7<|im_end|>", add_special_tokens=False).input_ids))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        loss = 0.0
        for question, reply in rows:
            ids = torch.tensor([question + reply])
            logits = model(ids).logits[0, len(question) - 1 : -1]
            loss = loss + torch.nn.functional.cross_entropy(logits, ids[0, len(question):])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("judge_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_judge_with_its_own_model_reads_its_replies_as_scores(judge_model, tiny_path):
    rewards = _rewards({"correct": CORRECT, "judge": {"_target_": "rlvr.rewards.models.Judge", "weight": 0.2,
                                                      "kwargs": {"model": str(judge_model)}}})
    rollouts = _rollouts() + [Rollout(prompt=PROMPTS[0], group=1, prompt_ids=[], completion_ids=[1],
                                      sampler_logprobs=[0.0], text="an answer it never saw", finish_reason="stop")]
    assert rewards.score(rollouts) == 0
    assert [r.rewards["judge"] for r in rollouts] == [0.7] * 4
    assert rollouts[0].reward == pytest.approx(1.0 + 0.2 * 0.7)
    rewards.close()
    # an untrained model replies with no score: every sample counts as a reward error and scores error_value
    untrained = _rewards({"correct": CORRECT, "judge": {"_target_": "rlvr.rewards.models.Judge",
                                                        "kwargs": {"model": str(tiny_path)}}}, error_value=-1.0)
    rollouts = _rollouts()
    assert untrained.score(rollouts) == 3
    assert all(r.rewards["judge"] == -1.0 and r.reward_errors["judge"] == "returned nan" for r in rollouts)
    untrained.close()


@pytest.mark.slow
def test_a_judge_without_a_model_asks_the_policys_engine(judge_model, cache_dir):
    from transformers import AutoTokenizer

    from rlvr.rollout.vllm_engine import VllmEngine

    from .conftest import compose_config

    rewards = _rewards({"correct": CORRECT, "judge": {"_target_": "rlvr.rewards.models.Judge", "kwargs": {}}})
    rollouts = _rollouts()
    assert rewards.score(rollouts) == 3  # no engine attached yet: the term fails, the run would go on
    assert "no policy engine was attached" in rollouts[0].reward_errors["judge"]
    cfg = compose_config(["model=tiny"], cache_dir)
    engine = VllmEngine(judge_model, cfg.rollout, "float32", 0, "cpu", cache_dir)
    try:
        rewards.attach(engine, AutoTokenizer.from_pretrained(judge_model))
        rollouts = _rollouts()
        assert rewards.score(rollouts) == 0
        assert [r.rewards["judge"] for r in rollouts] == [0.7] * 3
    finally:
        engine.close()
        rewards.close()
