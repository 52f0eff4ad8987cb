"""The supervised cold start: the policy imitates worked demonstrations, with the machinery of RL.

    rlvr sft +experiment=multiplication_4x2_sft            # the cold start alone: <run dir>/model
    rlvr train +experiment=multiplication_4x2_sft          # its recipe [sft, rl]: <run dir>/sft, then RL

A cold start is a run like an RL run (`rlvr.run.build`: the same model, learner, engine, canary,
checkpoints, exact resume, logging and evaluation) whose step is another objective on another data
source: demonstrations instead of rollouts, the `SFT` objective instead of RL's, on the learner's one
update path, on its own schedule (`sft.steps`, `sft.lr`... : `TrainConfig.schedule`), its logprobs at
temperature 1, its rows packed as `sft.packing` says.

Demonstrations come from the task (`task.demonstrations(n)`, drawn from its training split, so never a
held-out problem) or from a dataset of chat rows or prompt/completion rows; a dataset row whose prompt
is one of the task's held-out prompts is dropped. Each becomes token ids exactly as a rollout of the
same answer would be: the prompt rendered as the rollouts render it (`rlvr.prompts.render`), each
assistant turn's text tokenised on its own (the model's tokens: in the loss), what the template writes
between turns and the tool results (`between_turns`: out of the loss), then the token that ends the
assistant's turn (in the loss: the model learns to stop).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from rlvr import distributed
from rlvr.config import TrainConfig
from rlvr.data import Task, seeded_draw
from rlvr.data.files import DataError, read_located
from rlvr.errors import RlvrError
from rlvr.prompts import MAX_DRAWS, render
from rlvr.records import Demonstration, Prompt, Rollout
from rlvr.rollout.multiturn import between_turns
from rlvr.tools import CALL_CLOSE, CALL_OPEN, ToolBox

log = logging.getLogger("rlvr")

ROLES = ("system", "user", "assistant", "tool")


class SftDataError(RlvrError, ValueError):
    """Demonstrations that cannot be used; the message names the key, the file and the row."""


def from_row(row: dict, at: str, s) -> Demonstration:
    """The demonstration of a dataset row: its conversation (`sft.messages_key`), or a user message and
    the assistant's answer (`sft.prompt_key`, `sft.completion_key`). Raises SftDataError naming the row
    (`at`: the file and the row's line, e.g. "sft.data='d.jsonl', line 4")."""
    if s.messages_key in row:
        messages = row[s.messages_key]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise SftDataError(f"{at}: sft.messages_key={s.messages_key!r} must be a list of {{role, content}} messages")
    elif s.prompt_key in row and s.completion_key in row:
        messages = [{"role": "user", "content": row[s.prompt_key]},
                    {"role": "assistant", "content": row[s.completion_key]}]
    else:
        raise SftDataError(f"{at}: no column {s.messages_key!r} (sft.messages_key) and not both {s.prompt_key!r} and "
                           f"{s.completion_key!r} (sft.prompt_key, sft.completion_key); it has {sorted(row)}")
    turns: list[dict[str, str]] = []
    for k, m in enumerate(messages):
        role, content = m.get("role"), m.get("content") or ""
        if role not in ROLES or not isinstance(content, str):
            raise SftDataError(f"{at}, message {k}: role must be one of {ROLES} and content text, got role {role!r}")
        for call in m.get("tool_calls") or []:  # OpenAI-style calls, written in the rollouts' protocol
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            args = json.loads(args) if isinstance(args, str) else args
            content += f"{CALL_OPEN}{json.dumps({'name': fn.get('name'), 'arguments': args})}{CALL_CLOSE}"
        turns.append({"role": role, "content": content})
    first = next((k for k, m in enumerate(turns) if m["role"] == "assistant"), None)
    if first is None:
        raise SftDataError(f"{at}: no assistant message: nothing to learn from this row")
    if not any(m["role"] == "user" for m in turns[:first]):
        raise SftDataError(f"{at}: no user message before the first assistant message")
    if turns[-1]["role"] != "assistant":
        raise SftDataError(f"{at}: the conversation ends with a {turns[-1]['role']} message; it must end with the "
                           "assistant's")
    if not turns[-1]["content"].strip():
        raise SftDataError(f"{at}: the last assistant message is empty")
    return Demonstration(Prompt(turns[:first], ""), turns[first:])


def encode(tokenizer, tools: ToolBox | None, demos: list[Demonstration], max_len: int,
           where: list[str] | None = None, fitting_only: bool = False) -> list[Rollout]:
    """Token ids of `demos`, as the rollouts would hold the same answers (module docstring); an error
    names the demonstration (`where`: the file and line of each; default, the task's k-th). `max_len`:
    the context (rollout.max_model_len); `fitting_only`: one longer is left out instead of raising."""
    end = between_turns(tokenizer, tools, [])[:1]  # the token that ends the assistant's turn
    out = []
    for i, d in enumerate(demos):
        at = where[i] if where is not None else f"the task's demonstration {i + 1}"
        prompt_ids = render(tokenizer, d.prompt, tools)
        ids: list[int] = []
        mask: list[int] = []
        pending: list[dict[str, str]] = []  # messages between two assistant turns
        for turn in d.turns:
            if turn["role"] != "assistant":
                pending.append(turn)
                continue
            if pending:
                if tools is None and any(m["role"] == "tool" for m in pending):
                    raise SftDataError(f"{at}: a tool's result, but no tools are configured (the "
                                       "rollouts could never call one); add them, e.g. tools=calculator")
                try:
                    between = between_turns(tokenizer, tools, pending)
                except Exception as e:
                    raise SftDataError(f"{at}: the chat template cannot render its "
                                       f"{pending[0]['role']} message ({e})") from e
                ids += between
                mask += [0] * len(between)
                pending = []
            own = tokenizer(turn["content"], add_special_tokens=False).input_ids
            ids += own
            mask += [1] * len(own)
        ids += end
        mask += [1] * len(end)
        if len(prompt_ids) + len(ids) > max_len:
            if fitting_only:
                continue
            raise SftDataError(f"{at}: {len(prompt_ids) + len(ids)} tokens under the chat template, "
                               f"longer than the context rollout.max_model_len={max_len}; raise it or "
                               "shorten the row")
        out.append(Rollout(d.prompt, i, prompt_ids, ids, [0.0] * len(ids), turn["content"], "stop",
                           completion_mask=mask, conversation=d.turns))
    return out


def read_rows(key: str, path: str, fmt: str, parse, prompt_of, task: Task, error: type[Exception],
              shown: str) -> tuple[list, list[str]]:
    """The items `parse(row, at)` of every row of the dataset at `path` (the config key `key`), with each
    one's file and line, less those whose prompt (`prompt_of(item)`) is one of the task's held-out
    prompts (dropped with a warning, so that the evaluation never sees a problem `shown` was shown).
    Raises `error` naming the key for a file that cannot be read, is empty, or holds only held-out ones."""
    try:
        rows = read_located(path, fmt)
    except DataError as e:
        raise error(f"{key}: {e}") from e
    if not rows:
        raise error(f"{key}={path!r}: the file has no rows")
    where = [f"{key}={path!r}, {at}" for at, _ in rows]
    items = [parse(row, at) for at, (_, row) in zip(where, rows, strict=True)]
    held_out = {json.dumps(p.messages[-1]["content"]) for p in task.eval_prompts()}
    kept = [k for k, item in enumerate(items) if json.dumps(prompt_of(item).messages[-1]["content"]) not in held_out]
    if len(kept) < len(items):
        log.warning("%s: %d of %d rows ask one of the task's held-out prompts: dropped, so that the evaluation "
                    "never sees a problem %s was shown", key, len(items) - len(kept), len(items), shown)
    if not kept:
        raise error(f"{key}={path!r}: every row asks a held-out prompt of the task")
    return [items[k] for k in kept], [where[k] for k in kept]


class Demonstrations:
    """A cold start's data (a `rlvr.data.StageSource`): `next(n)` gives the next `n` demonstrations as
    token ids, from the task or from a dataset (in a seeded shuffled order, epoch after epoch).
    Everything is checked here, before the model loads."""

    def __init__(self, task: Task, cfg: TrainConfig, tokenizer, tools: ToolBox | None):
        s = cfg.sft
        self.task, self.tokenizer, self.tools = task, tokenizer, tools
        self.seed, self.max_len = cfg.seed, cfg.rollout.max_model_len
        self.position = 0  # demonstrations of a dataset taken so far
        self.too_long, self.warned = 0, False  # the task's demonstrations dropped as longer than the context
        self._check_template()
        if s.data == "task":
            if not hasattr(task, "demonstrations"):
                raise SftDataError(f"sft.data=task: the task {type(task).__name__} (data._target_) has no "
                                   "demonstrations; give sft.data the path of a dataset of demonstrations")
            self.rows = None
            state = task.state_dict()
            self._encode(task.demonstrations(s.batch_size), fitting_only=True)  # a sample, checked
            task.load_state_dict(state)
            return
        self.rows, where = read_rows("sft.data", s.data, s.format, lambda row, at: from_row(row, at, s),
                                     lambda d: d.prompt, task, SftDataError, "the cold start")
        self.encoded = self._encode(self.rows, where)
        log.info("cold start: %d demonstrations from %s, %d tokens in all", len(self.rows), s.data,
                 sum(len(r.prompt_ids) + len(r.completion_ids) for r in self.encoded))

    def _check_template(self) -> None:
        """A chat template that cannot render a tool's result (when tools are configured) is refused."""
        if self.tools is None:
            return
        try:
            ids = between_turns(self.tokenizer, self.tools, [{"role": "tool", "content": "8127"}])
        except Exception as e:
            raise SftDataError(f"the model's chat template cannot render a tool message ({type(e).__name__}: {e}); "
                               "the cold start and the rollouts write tool results with it") from e
        if "8127" not in self.tokenizer.decode(ids):
            raise SftDataError("the model's chat template drops tool messages (a tool's result would not reach the "
                               "model); use a model whose template renders role 'tool'")

    def _encode(self, demos: list[Demonstration], where: list[str] | None = None,
                fitting_only: bool = False) -> list[Rollout]:
        return encode(self.tokenizer, self.tools, demos, self.max_len, where, fitting_only)

    def next(self, n: int) -> list[Rollout]:
        """The next `n` demonstrations as token ids (every process draws the same). A task's demonstration
        longer than the context is dropped and another drawn (a file's rows were all checked at start)."""
        if self.rows is None:
            out: list[Rollout] = []
            for _ in range(MAX_DRAWS):
                drawn = self._encode(self.task.demonstrations(n - len(out)), fitting_only=True)
                self.too_long += n - len(out) - len(drawn)
                out += drawn
                if len(out) == n:
                    break
            else:
                raise SftDataError(f"only {len(out)} of the task's demonstrations drawn in {MAX_DRAWS} rounds fit "
                                   f"the context rollout.max_model_len={self.max_len}; raise it")
            out = [dataclasses.replace(r, group=j) for j, r in enumerate(out)]  # one group each, across draws
            if self.too_long and not self.warned:
                self.warned = True
                log.warning("cold start: %d of the task's demonstrations are longer than the context "
                            "rollout.max_model_len=%d: dropped and drawn again (said once)", self.too_long,
                            self.max_len)
            return out
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


def sft_step(run, step: int, watch) -> dict[str, float]:
    """One step of the cold start: the next `sft.batch_size` demonstrations -> the update -> its record,
    logged and checked by `watch`. The engine only evaluates here (it samples nothing to learn from), so
    the new weights go into it (checked, as RL's are) only on a step that an evaluation follows."""
    from rlvr.algorithms.objective import SFT
    from rlvr.learner import make_batch
    from rlvr.loop import evaluation_follows, sync

    learner, t0 = run.learner, time.perf_counter()
    demos = run.task.next(run.cfg.sft.batch_size)
    first, last = distributed.share(len(demos))  # across processes each rank learns on its share
    # Sorted by length: each micro-batch's rows are alike, so padded rows waste little (sft.packing=false).
    mine = sorted(demos[first:last], key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
    batch = make_batch(mine, learner.policy.pad_id)
    t_learn = time.perf_counter()
    learn = learner.step(batch, SFT())
    t_learn = time.perf_counter() - t_learn
    t_sync, t_canary, diff = sync(run) if evaluation_follows(run.schedule, step) else (0.0, 0.0, None)
    step_s = time.perf_counter() - t0
    record = {**learn, "time/learn_s": t_learn, "time/sync_s": t_sync, "time/canary_s": t_canary, "time/step_s": step_s,
              "sft/tokens_per_s": learn["learn/tokens"] / t_learn if t_learn else 0.0}
    if diff is not None:
        record["sync/logprob_max_diff"] = diff
        watch.canary(step, diff)
    run.logger.log(step, record)
    watch.skipped(step, learn["learn/skipped_updates"])
    return record


def run_sft(cfg: TrainConfig, run_dir: Path, recipe_dir: Path | None = None) -> dict[str, float]:
    """`rlvr sft`: the cold start alone, into `run_dir` (its model in `run_dir/model`); or, with
    `recipe_dir`, a stage of the recipe in `recipe_dir` (rlvr.recipe)."""
    from rlvr.errors import ConfigError
    from rlvr.loop import Plateau, run_steps
    from rlvr.run import build

    if cfg.sft.steps < 1:
        raise ConfigError("sft.steps: rlvr sft needs >= 1 (the optimizer steps of the cold start)")
    t_start = time.perf_counter()
    run = build(cfg, run_dir, "sft",
                wrap_task=lambda task, tokenizer, tools: Demonstrations(task, cfg, tokenizer, tools))
    s = cfg.sft
    until = Plateau(cfg.algorithm.group_size, s.plateau_patience, s.plateau_gain) if s.plateau_patience else None
    return run_steps(run, run_dir, sft_step, t_start, "cold start", recipe_dir, until)
