"""Dataset loaders: every file format, the column mapping, the split, the order, and every error."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rlvr.data import TaskError, build_task
from rlvr.data.files import DataError, DatasetTask, read_rows

from .conftest import compose_config

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(12)]


def write(path: Path, rows: list[dict], fmt: str) -> Path:
    """`rows` in format `fmt` at `path` (a folder for "hf")."""
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "hf":
        import datasets

        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return path


SUFFIX = {"jsonl": ".jsonl", "json": ".json", "csv": ".csv", "parquet": ".parquet", "hf": ""}


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "hf"])
def test_every_format_gives_the_same_prompts(tmp_path, fmt):
    path = write(tmp_path / f"data{SUFFIX[fmt]}", ROWS, fmt)
    rows = read_rows(str(path))  # the format is told by the name (a folder: a datasets folder)
    assert [r["question"] for r in rows] == [r["question"] for r in ROWS]
    task = DatasetTask(str(path), prompt_key="question", answer_key="answer", eval_size=4,
                       prompt_template="Q: {prompt} Put it in \\boxed{}.", system_prompt="Be brief.")
    everything = task.train + task.eval_prompts()
    assert len(task.eval_prompts()) == 4 and len(task.train) == 8
    by_question = {p.messages[1]["content"]: p for p in everything}
    for row in ROWS:
        p = by_question[f"Q: {row['question']} Put it in \\boxed{{}}."]  # braces in the template are kept
        assert p.messages[0] == {"role": "system", "content": "Be brief."}
        assert p.answer == row["answer"]
        assert str(p.meta["level"]) == str(row["level"])  # other columns reach the rewards (CSV: as text)


def test_json_object_of_splits_and_hf_split_choice(tmp_path):
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": ROWS[:6], "test": ROWS[6:]}))
    assert read_rows(str(path), split="test") == ROWS[6:]
    with pytest.raises(DataError, match=r"data.split \(lists here: \['test', 'train'\]\)"):
        read_rows(str(path))
    import datasets

    folder = tmp_path / "hf"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:6]),
                          "test": datasets.Dataset.from_list(ROWS[6:])}).save_to_disk(str(folder))
    assert [r["question"] for r in read_rows(str(folder), split="test")] == [r["question"] for r in ROWS[6:]]
    with pytest.raises(DataError, match=r"holds the splits \['test', 'train'\]; choose one with data.split"):
        read_rows(str(folder))


def test_messages_column_and_per_row_system(tmp_path):
    rows = [{"chat": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "ref"}],
             "sys": f"system {i}", "answer": i} for i in range(5)]
    task = DatasetTask(str(write(tmp_path / "chat.jsonl", rows, "jsonl")), messages_key="chat", system_key="sys",
                       eval_size=1)
    p = sorted(task.train + task.eval, key=lambda p: p.meta["row"])[2]
    assert p.messages == [{"role": "system", "content": "system 2"}, {"role": "user", "content": "hi 2"}]
    assert p.answer == "2"  # a non-string answer is passed as JSON


@pytest.mark.parametrize("content, fmt, message", [
    ([{"question": "a", "answer": "1"}, {"question": "b"}], "jsonl", r"rows.jsonl, line 2: column 'answer' is missing"),
    ([{"question": "a", "answer": "1"}, {"q": "b", "answer": "2"}], "jsonl", r"line 2: column 'question' is missing"),
    # the line an editor shows: blank lines count
    ('{"question": "a", "answer": "1"}\n\n\n{"q": "b", "answer": "2"}\n', "jsonl", r"rows.jsonl, line 4: column 'question'"),
    # the header is line 1
    ([{"question": "a", "answer": "1"}, {"question": "  ", "answer": "2"}], "csv", r"rows.csv, line 3: column 'question' is an empty prompt"),
    ([{"question": None, "answer": "1"}], "parquet", r"rows.parquet, row 1: column 'question' is missing"),
    ('{"question": "a", "answer": "1"}\n{"question": "b", "answer": \n', "jsonl", r"rows.jsonl, line 2: not valid JSON"),
    ('["a", "b"]\n', "jsonl", r"line 1: expected a JSON object, got list"),
    ('{"question": "a"', "json", r"rows.json: not valid JSON"),
    (b"PAR1 this is not parquet", "parquet", r"rows.parquet: not a readable Parquet file"),
])
def test_bad_rows_name_the_file_row_and_column(tmp_path, content, fmt, message):
    path = tmp_path / f"rows{SUFFIX[fmt]}"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        write(path, content, fmt)
    with pytest.raises(DataError, match=message):
        DatasetTask(str(path), prompt_key="question", answer_key="answer", eval_size=0)


def test_missing_files_unknown_formats_and_too_few_rows(tmp_path):
    with pytest.raises(DataError, match=r"data.path='.*nope.jsonl' does not exist"):
        read_rows(str(tmp_path / "nope.jsonl"))
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(DataError, match="cannot tell its format from the name; set data.format"):
        read_rows(str(tmp_path / "data.txt"))
    with pytest.raises(DataError, match="cannot load it as a Hugging Face dataset"):
        read_rows(str(tmp_path), format="hf")  # a folder that save_to_disk did not write
    path = write(tmp_path / "one.jsonl", ROWS[:1], "jsonl")
    with pytest.raises(DataError, match=r"has 1 row\(s\): too few to hold out any for evaluation"):
        DatasetTask(str(path), prompt_key="question")


@pytest.mark.parametrize(("rows", "held_out"), [(2, 1), (10, 2), (64, 13), (400, 64)])
def test_a_file_smaller_than_eval_size_holds_out_a_fifth(tmp_path, caplog, rows, held_out):
    """data.eval_size=64 (the default) of a 10-row file would leave nothing to train on: a file shorter than
    twice eval_size gives a fifth of its rows to evaluation, and the log says how many rows went where."""
    path = write(tmp_path / "d.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(rows)], "jsonl")
    with caplog.at_level("INFO"):
        task = DatasetTask(str(path), prompt_key="question")
    assert (len(task.eval), len(task.train)) == (held_out, rows - held_out)
    assert f"data: {held_out} of the {rows} rows of {path} held out for evaluation" in caplog.text


def test_order_is_seeded_covers_every_row_each_epoch_and_resumes(tmp_path):
    path = str(write(tmp_path / "d.jsonl", ROWS, "jsonl"))

    def task(seed):
        return DatasetTask(path, prompt_key="question", eval_size=2, seed=seed)

    a, b, c = task(0), task(0), task(1)
    assert {p.meta["row"] for p in a.eval} == {p.meta["row"] for p in c.eval}  # the split ignores the seed
    assert not {p.meta["row"] for p in a.eval} & {p.meta["row"] for p in a.train}
    first = [p.meta["row"] for p in a.sample(10)]
    assert first == [p.meta["row"] for p in b.sample(10)]
    assert first != [p.meta["row"] for p in c.sample(10)]
    assert sorted(first) == sorted(p.meta["row"] for p in a.train)  # one epoch: every training row once
    state = json.loads(json.dumps(a.state_dict()))
    later = [p.meta["row"] for p in a.sample(15)]
    b.load_state_dict(state)
    assert [p.meta["row"] for p in b.sample(15)] == later and a.metrics() == {"data/epoch": 3.0}
    in_order = DatasetTask(path, prompt_key="question", eval_size=2, shuffle=False)
    assert [p.meta["row"] for p in in_order.sample(3)] == sorted(p.meta["row"] for p in in_order.train)[:3]


def test_prompts_longer_than_the_context_are_dropped(tmp_path, tiny_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    rows = [{"prompt": "short", "answer": "1"}] * 4 + [{"prompt": "long " * 400, "answer": "2"}] * 4
    path = str(write(tmp_path / "d.jsonl", rows, "jsonl"))
    task = DatasetTask(path, eval_size=0, tokenizer=tok, max_prompt_tokens=100)
    assert len(task.train) == 4 and all(p.answer == "1" for p in task.train)
    with pytest.raises(DataError, match="every prompt is longer than data.max_prompt_tokens=5 tokens"):
        DatasetTask(path, eval_size=0, tokenizer=tok, max_prompt_tokens=5)


def test_build_task_from_config(tmp_path, tiny_path):
    path = write(tmp_path / "d.jsonl", ROWS, "jsonl")
    cfg = compose_config(["data=jsonl", f"data.path={path}", "data.prompt_key=question", "data.eval_size=2",
                          "rollout.max_model_len=300", "rollout.max_tokens=44"])
    task = build_task(cfg, tiny_path)
    assert len(task.train) == 10 and task.sample(3)
    cfg = compose_config(["+experiment=multiplication"])
    cfg.data.levels = []
    with pytest.raises(TaskError, match=r"data \(rlvr.data.multiplication.MultiplicationTask\): data.levels"):
        build_task(cfg)
    cfg = compose_config(["data=jsonl", f"data.path={path}", "data.prompt_key=question",
                          "data._target_=rlvr.data.multiplication.MultiplicationTask"])
    with pytest.raises(TaskError, match="MultiplicationTask takes no key 'answer_key'"):
        build_task(cfg)


def test_a_hub_name_that_cannot_be_reached_fails_clearly(monkeypatch):
    """A name, not a path, goes to the hub; with no hub (offline here, as on these machines) it says so."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # fail at once instead of retrying DNS
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"data.path='someone/no-such-dataset': cannot load it as a Hugging Face "
                                        r"dataset \(ConnectionError"):
        read_rows("someone/no-such-dataset", split="train")
