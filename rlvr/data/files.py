"""A task from a dataset: JSONL, JSON, CSV or Parquet files, or a Hugging Face `datasets` folder
(`save_to_disk`) or hub name (when the network allows).

Each row becomes a `Prompt`: the user message is `prompt_template` with "{prompt}" replaced by the
row's `prompt_key` column (or the row's chat messages, `messages_key`), an optional system message
(`system_key` column or a fixed `system_prompt`), and `answer_key` as the ground truth. The other
columns go into `Prompt.meta` for rewards that need them (e.g. a JSON schema per row). Every row is
checked at start: a missing column or an empty prompt fails with the file, row and column.

Evaluation uses `eval_path` when given, else `eval_size` rows held out from `path` (a fifth of the
file when `eval_size` would leave less than half of it to train on), chosen with a fixed seed, so the
same for every run; the log says how many. Training draws the other rows in a seeded shuffled order,
epoch after epoch. Rows whose prompt is longer than `max_prompt_tokens` under the model's chat template
are dropped at load (the engine's context is checked for every task by `rlvr.prompts`).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
from pathlib import Path

from rlvr.data import Passes
from rlvr.errors import RlvrError
from rlvr.records import Prompt

log = logging.getLogger(__name__)

# Without data.eval_path, data.eval_size rows are held out when that leaves at least half the file to train
# on; of a smaller file, this share.
HELD_OUT_SHARE = 0.2

FORMATS = ("auto", "jsonl", "json", "csv", "parquet", "hf")
SUFFIXES = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


class DataError(RlvrError, ValueError):
    """A dataset that cannot be used; the message names the file, and the row and column when it is one of them."""


def detect_format(path: str) -> str:
    """The format of `path` from its suffix; a folder is a `datasets` folder, "owner/name" a hub name."""
    p = Path(path)
    if p.is_dir():
        return "hf"
    if p.suffix in SUFFIXES:
        return SUFFIXES[p.suffix]
    if not p.exists() and not path.startswith((".", "/", "~")) and path.count("/") <= 1:
        return "hf"  # a hub name like "openai/gsm8k"
    raise DataError(f"data.path={path!r}: cannot tell its format from the name; set data.format to one of "
                    f"{FORMATS[1:]}")


def read_rows(path: str, format: str = "auto", split: str | None = None) -> list[dict]:
    """The rows of a dataset as dicts, in file order."""
    return [row for _, row in read_located(path, format, split)]


def read_located(path: str, format: str = "auto", split: str | None = None) -> list[tuple[str, dict]]:
    """The rows of a dataset, in file order, each with where it is as an error names it: "line N" in a
    JSONL or CSV file (the line an editor shows: blank lines and the CSV header counted), "row N" from 1
    in a JSON list, a Parquet file or a `datasets` folder."""
    format = detect_format(path) if format == "auto" else format
    if format not in FORMATS:
        raise DataError(f"data.format must be one of {FORMATS}, got {format!r}")
    if format != "hf" and not Path(path).is_file():
        raise DataError(f"data.path={path!r} does not exist (or is not a file)")
    if format == "jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise DataError(f"{path}, line {line_no}: not valid JSON ({e})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}, line {line_no}: expected a JSON object, got {type(row).__name__}")
                rows.append((f"line {line_no}", row))
        return rows
    if format == "json":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except ValueError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        if isinstance(data, dict):  # {"train": [...], "test": [...]} or {"data": [...]}
            lists = {k: v for k, v in data.items() if isinstance(v, list)}
            key = split if split is not None else (next(iter(lists)) if len(lists) == 1 else None)
            if key not in lists:
                raise DataError(f"{path}: a JSON object must hold one list of rows, or name one with data.split "
                                f"(lists here: {sorted(lists)})")
            data = lists[key]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataError(f"{path}: expected a list of JSON objects (one per row)")
        return _numbered(data)
    if format == "csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            return [(f"line {reader.line_num}", row) for row in reader]  # (the row's last line, if it spans several)
    if format == "parquet":
        import pyarrow.parquet as pq

        try:
            return _numbered(pq.read_table(path).to_pylist())
        except Exception as e:  # pyarrow raises ArrowInvalid on a damaged file
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    return _numbered(_read_hf(path, split))


def _numbered(rows: list[dict]) -> list[tuple[str, dict]]:
    return [(f"row {k}", row) for k, row in enumerate(rows, 1)]


def _read_hf(path: str, split: str | None) -> list[dict]:
    import datasets

    try:
        if Path(path).is_dir():
            data = datasets.load_from_disk(path)
        else:
            data = datasets.load_dataset(path, split=split)
    except Exception as e:  # no such folder, not a saved dataset, or no network for a hub name
        raise DataError(f"data.path={path!r}: cannot load it as a Hugging Face dataset ({type(e).__name__}: {e})") from None
    if isinstance(data, datasets.DatasetDict):
        if split is None and len(data) == 1:
            split = next(iter(data))
        if split not in data:
            raise DataError(f"data.path={path!r} holds the splits {sorted(data)}; choose one with data.split")
        data = data[split]
    return data.to_list()


class DatasetTask:
    """Prompts from the rows of a dataset (see the module docstring for every option)."""

    def __init__(self, path: str, prompt_key: str | None = "prompt", answer_key: str = "answer",
                 messages_key: str | None = None, system_key: str | None = None,
                 system_prompt: str | None = None, prompt_template: str = "{prompt}", format: str = "auto",
                 split: str | None = None, eval_path: str | None = None, eval_split: str | None = None,
                 eval_size: int = 64, shuffle: bool = True, max_prompt_tokens: int | None = None,
                 tokenizer=None, batch_size: int = 8, seed: int = 0):
        if messages_key is None and "{prompt}" not in prompt_template:
            raise DataError(f"data.prompt_template must contain {{prompt}}: {prompt_template!r}")
        self.keys = {"prompt": prompt_key, "answer": answer_key, "messages": messages_key, "system": system_key}
        self.system_prompt, self.template = system_prompt, prompt_template
        rows = read_located(path, format, split)
        prompts = [self._prompt(row, f"{path}, {at}", i) for i, (at, row) in enumerate(rows, 1)]
        if eval_path is not None:
            prompts_at = read_located(eval_path, format, eval_split)
            eval_prompts = [self._prompt(row, f"{eval_path}, {at}", i) for i, (at, row) in enumerate(prompts_at, 1)]
        else:
            if len(prompts) < 2:
                raise DataError(f"{path} has {len(prompts)} row(s): too few to hold out any for evaluation and train on "
                                "the rest (give data.eval_path)")
            n_eval = eval_size if 2 * eval_size <= len(prompts) else math.ceil(len(prompts) * HELD_OUT_SHARE)
            held_out = set(random.Random(12345).sample(range(len(prompts)), n_eval))  # fixed for every run
            log.info("data: %d of the %d rows of %s held out for evaluation (data.eval_size=%d, or %d %% of a file "
                     "that is not twice as long), %d to train on", n_eval, len(prompts), path, eval_size,
                     round(100 * HELD_OUT_SHARE), len(prompts) - n_eval)
            eval_prompts = [p for i, p in enumerate(prompts) if i in held_out]
            prompts = [p for i, p in enumerate(prompts) if i not in held_out]
        if tokenizer is not None and max_prompt_tokens is not None:
            prompts = self._fitting(prompts, tokenizer, max_prompt_tokens, path)
            eval_prompts = self._fitting(eval_prompts, tokenizer, max_prompt_tokens, eval_path or path)
        self.train, self.eval = prompts, eval_prompts[:eval_size] if eval_path else eval_prompts
        self.passes = Passes(len(self.train), seed, shuffle)

    def _prompt(self, row: dict, where: str, row_no: int) -> Prompt:
        """The prompt of `row` (`where`: the file and the row's line, for errors; `row_no`: its place in the
        file's rows, from 1, kept as meta["row"])."""
        def column(key: str) -> object:
            if key not in row or row[key] is None:
                raise DataError(f"{where}: column {key!r} is missing (columns: {sorted(row)})")
            return row[key]

        if self.keys["messages"] is not None:
            messages = column(self.keys["messages"])
            if (not isinstance(messages, list) or not messages
                    or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)):
                raise DataError(f"{where}: column {self.keys['messages']!r} must be a non-empty list of "
                                "{'role': ..., 'content': ...} messages")
            messages = [{"role": m["role"], "content": m["content"]} for m in messages]
            while messages and messages[-1]["role"] == "assistant":  # a reference reply is not part of the prompt
                messages.pop()
            if not messages:
                raise DataError(f"{where}: column {self.keys['messages']!r} holds no user message")
        else:
            text = str(column(self.keys["prompt"]))
            if not text.strip():
                raise DataError(f"{where}: column {self.keys['prompt']!r} is an empty prompt")
            messages = [{"role": "user", "content": self.template.replace("{prompt}", text)}]
        system = str(column(self.keys["system"])) if self.keys["system"] is not None else self.system_prompt
        if system is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system})
        answer = column(self.keys["answer"])
        used = {k for k in self.keys.values() if k is not None}
        return Prompt(messages=messages, answer=answer if isinstance(answer, str) else json.dumps(answer),
                      meta={"row": row_no, **{k: v for k, v in row.items() if k not in used}})

    @staticmethod
    def _fitting(prompts: list[Prompt], tokenizer, limit: int, path: str) -> list[Prompt]:
        from rlvr.prompts import render

        kept = [p for p in prompts if len(render(tokenizer, p)) <= limit]
        if len(kept) < len(prompts):
            log.warning("%s: dropped %d of %d prompts longer than %d tokens (data.max_prompt_tokens)",
                        path, len(prompts) - len(kept), len(prompts), limit)
        if prompts and not kept:
            raise DataError(f"{path}: every prompt is longer than data.max_prompt_tokens={limit} tokens; raise it "
                            "(and rollout.max_model_len) or shorten the prompts")
        return kept

    def sample(self, n: int) -> list[Prompt]:
        """The next `n` training prompts; a new (shuffled) pass over the rows starts when one ends."""
        return [self.train[self.passes.next()] for _ in range(n)]

    def eval_prompts(self) -> list[Prompt]:
        return self.eval

    def update(self, accuracy: float) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"data/epoch": float(self.passes.epoch)}

    def state_dict(self) -> dict:
        return self.passes.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.passes.load_state_dict(state)
