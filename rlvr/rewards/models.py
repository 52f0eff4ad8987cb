"""Model-based reward terms: a learned reward model, and an LLM judge. Both are batched terms (a
class as `_target_`, see `rlvr.rewards`), combined with rule terms by the usual weights and
`reward.combine`; their time shows in `time/reward_s`.

    reward:
      terms:
        correct: {_target_: rlvr.rewards.answer.numeric_match, weight: 1.0}
        rm:
          _target_: rlvr.rewards.models.RewardModel
          weight: 0.5
          kwargs: {path: /models/my-reward-model, scale: 0.1}
        judge:
          _target_: rlvr.rewards.models.Judge
          weight: 0.2
          kwargs: {model: null}   # null: ask the policy itself; or a local instruct model's folder
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from rlvr.records import Prompt

log = logging.getLogger(__name__)


def _conversation(prompt: Prompt, completion: str) -> list[dict[str, str]]:
    return [*prompt.messages, {"role": "assistant", "content": completion}]


class RewardModel:
    """Scores (prompt, completion) with a Hugging Face sequence-classification model from a local
    folder: `scale * (logit[label] - shift)`, or `scale * sigmoid(logit[label] - shift)` with
    `sigmoid: true`. The conversation goes through the reward model's own chat template (if it has
    one; else prompt and completion joined by blank lines), cut to `max_length` tokens from the left,
    in batches of `batch_size` on `device` (default: the learner's)."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 16, scale: float = 1.0, shift: float = 0.0,
                 sigmoid: bool = False, label: int = 0, max_length: int = 1024):
        import json

        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"kwargs.path={path!r} is not a model folder (no config.json)")
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
        if not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise ValueError(f"kwargs.path={path!r} is not a sequence-classification reward model (its architectures: "
                             f"{architectures or 'none'}; want a ...ForSequenceClassification)")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.truncation_side = "left"  # keep the completion, which is what is judged
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).to(device).eval()
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if not 0 <= label < self.model.config.num_labels:
            raise ValueError(f"kwargs.label={label} but the model has {self.model.config.num_labels} labels")
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self.scale, self.shift, self.sigmoid, self.label = scale, shift, sigmoid, label

    def text(self, completion: str, prompt: Prompt) -> str:
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(_conversation(prompt, completion), tokenize=False)
        return "\n\n".join([*(m["content"] for m in prompt.messages), completion])

    def __call__(self, completions: list[str], prompts: list[Prompt]) -> list[float]:
        import torch

        out: list[float] = []
        for start in range(0, len(completions), self.batch_size):
            texts = [self.text(c, p) for c, p in zip(completions[start : start + self.batch_size],
                                                     prompts[start : start + self.batch_size], strict=True)]
            batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                                   max_length=self.max_length, add_special_tokens=False).to(self.device)
            with torch.no_grad():
                logits = self.model(**batch).logits[:, self.label].float() - self.shift
            out += (self.scale * (logits.sigmoid() if self.sigmoid else logits)).tolist()
        return out

    def close(self) -> None:
        del self.model


RUBRIC = ("Here is a question, a reference answer and a student's answer.\n\nQuestion: {prompt}\n\n"
          "Reference answer: {reference}\n\nStudent's answer: {answer}\n\n"
          "Is the student's answer correct and well reasoned? Reply with a single whole number from 0 (wrong) "
          "to {max_score} (fully correct), nothing else.")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Judge:
    """An instruct model asked `rubric` (with {prompt}, {answer}, {reference}, {max_score}) about each
    completion, greedily, in one batched engine call; the first number of its reply, divided by
    `max_score`, is the score. A reply without a number in [0, max_score] scores NaN (counted as a
    reward error, scored `reward.error_value`).

    `model`: null asks the policy itself through its rollout engine (the judge changes as it trains);
    a folder path loads that model into a transformers engine of its own on `device`."""

    def __init__(self, model: str | None = None, rubric: str = RUBRIC, max_score: int = 10, max_tokens: int = 8,
                 max_answer_chars: int = 2000, device: str = "cpu"):
        for key in ("{answer}",):
            if key not in rubric:
                raise ValueError(f"kwargs.rubric must contain {key}")
        self.rubric, self.max_score, self.max_tokens, self.max_answer_chars = rubric, max_score, max_tokens, max_answer_chars
        self.engine = self.tokenizer = None
        self.own = model is not None
        if model is not None:
            from omegaconf import OmegaConf
            from transformers import AutoTokenizer

            from rlvr.rollout.hf_engine import TransformersEngine

            if not (Path(model) / "config.json").is_file():
                raise ValueError(f"kwargs.model={model!r} is not a model folder (no config.json)")
            cfg = OmegaConf.create({"temperature": 1.0, "top_p": 1.0, "max_tokens": max_tokens})
            self.engine = TransformersEngine(Path(model), cfg, "float32", 0, device)
            self.tokenizer = AutoTokenizer.from_pretrained(model)

    def attach(self, engine, tokenizer) -> None:
        """The policy's engine, for a judge without a model of its own."""
        if not self.own:
            self.engine, self.tokenizer = engine, tokenizer

    def question(self, completion: str, prompt: Prompt) -> Prompt:
        asked = prompt.messages[-1]["content"] if prompt.messages else ""
        text = self.rubric.format(prompt=asked, answer=completion[-self.max_answer_chars:], reference=prompt.answer,
                                  max_score=self.max_score)
        return Prompt(messages=[{"role": "user", "content": text}], answer="")

    def read(self, reply: str) -> float:
        """The score in a reply: its first number over `max_score`, NaN when there is none in range.

        >>> Judge(max_score=10).read(" 7/10"), Judge().read("ten"), Judge().read("12")
        (0.7, nan, nan)
        """
        found = _NUMBER.search(reply)
        value = float(found.group()) if found else math.nan
        return value / self.max_score if 0 <= value <= self.max_score else math.nan

    def __call__(self, completions: list[str], prompts: list[Prompt]) -> list[float]:
        from rlvr.prompts import render

        if self.engine is None:
            raise RuntimeError("the judge has no model: kwargs.model is null and no policy engine was attached")
        questions = [self.question(c, p) for c, p in zip(completions, prompts, strict=True)]
        ids = [render(self.tokenizer, q) for q in questions]
        replies = self.engine.generate(questions, ids, n=1, seed=0, greedy=True, context="in the judge reward",
                                       max_tokens=[self.max_tokens] * len(ids))
        scores = [self.read(r.text) for r in replies]
        unread = [r.text for r, s in zip(replies, scores, strict=True) if math.isnan(s)]
        if unread:
            log.warning("the judge's reply held no score in [0, %d] for %d of %d completions (first: %r)",
                        self.max_score, len(unread), len(replies), unread[0][:100])
        return scores

    def close(self) -> None:
        if self.own and self.engine is not None:
            self.engine.close()
