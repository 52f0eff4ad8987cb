"""Preference tuning, the `dpo` stage of a recipe: the policy learns from pairs of answers to one prompt,
the chosen over the rejected one, with DPO (against the stage's starting model, a frozen reference) or
SimPO (reference-free); `rlvr.algorithms.objective.preference_loss`.

    rlvr train recipe=[dpo] dpo.steps=50 dpo.data=pairs.jsonl          # from a dataset of pairs
    rlvr train +experiment=multiplication recipe=[dpo] dpo.steps=50     # on-policy, pairs the verifier ranks
    rlvr train +experiment=multiplication_4x2_sft recipe=[sft,dpo,rl] dpo.steps=20

Like the cold start (rlvr.sft) it is a run like an RL run (`rlvr.run.build`: the same model, learner,
engine, canary, checkpoints, exact resume, logging and evaluation) with its own data source and
objective, on the learner's one update path (`Learner.step(batch, Preference(...))`).

Pairs come from
- a dataset (`dpo.data=<path>`): rows of prompt / chosen / rejected, each a string or a list of
  messages (TRL's conversational preference format; without a prompt column, chosen and rejected are
  whole conversations sharing their messages up to the first assistant turn). Each answer becomes
  token ids as a demonstration would (`rlvr.sft.encode`: as a rollout of the same answer); a row whose
  prompt is one of the task's held-out prompts is dropped. Drawn in a seeded shuffled order, epoch
  after epoch.
- the policy itself (`dpo.data=on_policy`): each step samples `algorithm.group_size` answers to
  `data.batch_size` of the task's prompts (DAPO's dynamic sampling applies when enabled), scores them
  with the run's rewards, and pairs the best-scored answer of a group with the worst, the second with
  the second worst, ... while the first scores higher, up to `dpo.pairs_per_group` pairs a group.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from rlvr import distributed
from rlvr.config import TrainConfig
from rlvr.data import Task, seeded_draw
from rlvr.records import Demonstration, Prompt, Rollout
from rlvr.sft import SftDataError, encode, from_row, read_rows
from rlvr.tools import ToolBox

log = logging.getLogger("rlvr")


class PairDataError(SftDataError):
    """Pairs that cannot be used; the message names the key, the file and the row."""


def pair_from_row(row: dict, at: str, d) -> tuple[Demonstration, Demonstration]:
    """The (chosen, rejected) demonstrations of a dataset row (module docstring); raises PairDataError
    naming the row (`at`: the file and the row's line)."""
    for key, name in ((d.chosen_key, "dpo.chosen_key"), (d.rejected_key, "dpo.rejected_key")):
        if key not in row:
            raise PairDataError(f"{at}: no column {key!r} ({name}); it has {sorted(row)}")

    def conversation(answer, key: str) -> list[dict]:
        if isinstance(answer, str):
            return [{"role": "assistant", "content": answer}]
        if isinstance(answer, list):
            return list(answer)
        raise PairDataError(f"{at}: {key!r} must be a string or a list of messages, got {type(answer).__name__}")

    if d.prompt_key in row:
        prompt = row[d.prompt_key]
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(prompt, list):
            raise PairDataError(f"{at}: {d.prompt_key!r} (dpo.prompt_key) must be a string or a list of messages")
        sides = [list(prompt) + conversation(row[k], k) for k in (d.chosen_key, d.rejected_key)]
    else:  # whole conversations: the prompt is what comes before the first assistant message
        sides = [conversation(row[k], k) for k in (d.chosen_key, d.rejected_key)]
    demos = []
    for key, messages in zip((d.chosen_key, d.rejected_key), sides, strict=True):
        try:
            demos.append(from_row({"messages": messages}, f"{at}, {key!r}", _MESSAGES))
        except SftDataError as e:
            raise PairDataError(str(e)) from e
    chosen, rejected = demos
    if chosen.prompt.messages != rejected.prompt.messages:
        raise PairDataError(f"{at}: {d.chosen_key!r} and {d.rejected_key!r} answer different prompts (their "
                            "messages before the first assistant message differ)")
    return chosen, rejected


@dataclasses.dataclass(frozen=True)
class _Keys:  # what rlvr.sft.from_row reads of sft.*: a conversation under one key
    messages_key: str
    prompt_key: str = "\0"
    completion_key: str = "\0"


_MESSAGES = _Keys("messages")


class Pairs:
    """A preference stage's pairs from a dataset (a `rlvr.data.StageSource`), all checked and encoded
    at start (before the model loads): `next(n)` gives the next `n` pairs as token ids, (chosen,
    rejected) each, in a seeded shuffled order, epoch after epoch."""

    def __init__(self, task: Task, cfg: TrainConfig, tokenizer, tools: ToolBox | None):
        d = cfg.dpo
        self.task, self.seed, self.position = task, cfg.seed, 0
        pairs, where = read_rows("dpo.data", d.data, d.format, lambda row, at: pair_from_row(row, at, d),
                                 lambda pair: pair[0].prompt, task, PairDataError, "the stage")
        max_len = cfg.rollout.max_model_len
        self.encoded = [tuple(encode(tokenizer, tools, list(pair), max_len, [at] * 2)) for pair, at in zip(pairs, where, strict=True)]
        log.info("preference stage: %d pairs from %s", len(self.encoded), d.data)

    def next(self, n: int) -> list[tuple[Rollout, Rollout]]:
        """The next `n` pairs (every process draws the same), in a seeded order per epoch."""
        drawn = [self.encoded[k] for k in seeded_draw(len(self.encoded), self.seed, self.position, n)]
        self.position += n
        return drawn

    # What the run asks of a stage's source (rlvr.data.StageSource): the task's prompts, and checkpoints.
    def sample(self, n: int) -> list[Prompt]:
        return self.task.sample(n)

    def eval_prompts(self) -> list[Prompt]:
        return self.task.eval_prompts()

    def state_dict(self) -> dict:
        return {"task": self.task.state_dict(), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.task.load_state_dict(state["task"])
        self.position = state["position"]


def ranked_pairs(rollouts: list[Rollout], scores: torch.Tensor, most: int) -> list[tuple[Rollout, Rollout]]:
    """Pairs from groups the reward ranked: in each group (a row of `scores` [K, G], its G rollouts
    adjacent in `rollouts`), the best-scored answer with the worst, the second with the second worst, ...
    while the first scores strictly higher, at most `most` pairs a group.

    >>> from rlvr.records import Prompt
    >>> rs = [Rollout(Prompt([], ""), 0, [1], [t], [0.0], str(t), "stop") for t in range(4)]
    >>> [(c.text, r.text) for c, r in ranked_pairs(rs, torch.tensor([[1.0, 0.0, 1.0, 0.0]]), 4)]
    [('0', '3'), ('2', '1')]
    """
    K, G = scores.shape
    out = []
    for k in range(K):
        order = sorted(range(G), key=lambda j: -float(scores[k, j]))  # best first; ties keep sampling order
        for i in range(min(most, G // 2)):
            best, worst = order[i], order[G - 1 - i]
            if not float(scores[k, best]) > float(scores[k, worst]):
                break
            out.append((rollouts[k * G + best], rollouts[k * G + worst]))
    return out


def dpo_step(run, step: int, watch) -> dict[str, float]:
    """One step of the preference stage: pairs (sampled and ranked, or the next of the dataset) -> the
    update -> new weights into the engine (every step on-policy, else before an evaluation) -> the record."""
    from rlvr.algorithms.objective import Preference, PreferenceConfig
    from rlvr.learner import make_batch
    from rlvr.loop import evaluation_follows, sync
    from rlvr.metrics import summarise
    from rlvr.train import collect_groups

    cfg, learner, d = run.cfg, run.learner, run.cfg.dpo
    t0 = time.perf_counter()
    record: dict[str, float] = {}
    if d.data == "on_policy":
        G = cfg.algorithm.group_size
        c = collect_groups(run.task, run.fit, run.generate, run.rewards,
                           lambda rollouts: (run.rewards.scores(rollouts, G), {}), cfg, step)
        pairs = ranked_pairs(c.rollouts, c.scores, d.pairs_per_group)
        record.update(summarise(c.first_round, run.rewards))
        record.update({"time/rollout_s": c.times["rollout"], "pref/groups_with_pairs":
                       float(len({id(ch.prompt) for ch, _ in pairs}))})
        if not pairs:
            log.warning("step %d: every group's answers scored alike: no pair to learn from this step", step)
    else:
        pairs = run.task.next(d.batch_size)
    first, last = distributed.share(len(pairs))  # across processes each rank learns on its share
    rows = [dataclasses.replace(r, group=k) for k, pair in enumerate(pairs[first:last]) for r in pair]
    batch = make_batch(rows, learner.policy.pad_id)
    t_learn = time.perf_counter()
    learn = learner.step(batch, Preference(PreferenceConfig(d.loss, d.beta, d.simpo_gamma)))
    t_learn = time.perf_counter() - t_learn
    on_policy = d.data == "on_policy"
    t_sync, t_canary, diff = sync(run) if on_policy or evaluation_follows(run.schedule, step) else (0.0, 0.0, None)
    record.update({**learn, "pref/pairs": float(len(pairs)), "time/learn_s": t_learn, "time/sync_s": t_sync,
                   "time/canary_s": t_canary, "time/step_s": time.perf_counter() - t0})
    if diff is not None:
        record["sync/logprob_max_diff"] = diff
        watch.canary(step, diff)
    run.logger.log(step, record)
    watch.skipped(step, learn["learn/skipped_updates"])
    return record


def run_dpo(cfg: TrainConfig, run_dir: Path, recipe_dir: Path | None = None) -> dict[str, float]:
    """The preference stage into `run_dir` (its model in `run_dir/model`); `recipe_dir`: the run dir of
    the recipe it is a stage of."""
    from rlvr.errors import ConfigError
    from rlvr.loop import run_steps
    from rlvr.run import build

    if cfg.dpo.steps < 1:
        raise ConfigError("dpo.steps: a recipe with the dpo stage needs >= 1 (its optimizer steps)")
    t_start = time.perf_counter()
    wrap = None if cfg.dpo.data == "on_policy" else (lambda task, tokenizer, tools: Pairs(task, cfg, tokenizer, tools))
    run = build(cfg, run_dir, stage="dpo", wrap_task=wrap)
    return run_steps(run, run_dir, dpo_step, t_start, "preference stage", recipe_dir)
