"""Tasks and rewards chosen in config, end to end through the CLI on model=tiny: function picking,
a dataset file, the docs' plug-in example, and a bad dataset that must fail at start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import REPO, cli_here, run_cli
from .test_files import write

pytestmark = pytest.mark.slow

TINY = ["model=tiny", "data.batch_size=2", "algorithm.group_size=4", "rollout.max_tokens=24", "data.eval_size=4",
        "trainer.save_model=false"]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_function_picking_with_arguments_trains(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = run_cli(["train", "+experiment=function_picking", *TINY, "data.distractors=1", "data.arguments=easy",
                      "sft.steps=2", "sft.batch_size=4", "sft.warmup_steps=0",  # (the experiment's cold start, short)
                      "trainer.max_steps=2", "trainer.samples_every=1", "reward.workers=1",
                      f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = _metrics(run_dir)
    assert {"reward/call", "reward/name", "reward/format", "reward/errors"} <= steps[1].keys()
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    call = json.loads(sample["answer"])
    assert call["name"] in sample["messages"][-1]["content"] and isinstance(call["arguments"], dict)


def test_a_jsonl_dataset_trains_with_a_library_reward(tmp_path, cache_dir):
    rows = [{"question": f"Say {i}", "answer": str(i), "note": "x"} for i in range(20)]
    path = write(tmp_path / "problems.jsonl", rows, "jsonl")
    run_dir = tmp_path / "run"
    result = run_cli(["train", "data=jsonl", f"data.path={path}", "data.prompt_key=question", "reward=exact",
                      *TINY, "trainer.max_steps=2", f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["step"] for m in _metrics(run_dir)] == [0, 1, 2, 2] and "data/epoch" in _metrics(run_dir)[1]


def test_a_dataset_with_a_missing_column_fails_at_start_naming_file_row_and_column(tmp_path, cache_dir):
    rows = [{"question": "a", "answer": "1"}] * 5 + [{"question": "b"}]
    path = write(tmp_path / "bad.jsonl", rows, "jsonl")
    run_dir = tmp_path / "run"
    result = cli_here(["train", "data=jsonl", f"data.path={path}", "data.prompt_key=question", "reward=exact",
                      *TINY, f"hydra.run.dir={run_dir}"], cache=cache_dir)
    assert result.returncode == 1
    assert f"{path}, line 6: column 'answer' is missing" in result.stderr
    assert "Traceback" not in result.stderr and not (run_dir / "metrics.jsonl").exists()


def _readme_block(name: str) -> str:
    """The code block of docs/tasks.md that follows the marker comment `<!-- name -->`."""
    found = re.search(rf"<!-- {name} -->\s*```\w*\n(.*?)```", (REPO / "docs" / "tasks.md").read_text(), re.DOTALL)
    assert found, f"docs/tasks.md has no block marked {name}"
    return found.group(1)


def test_the_readme_plugin_example_runs_as_documented(tmp_path, cache_dir):
    """The docs' plug-in (docs/tasks.md: a reward module, a task module and their YAML files) works as written."""
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(_readme_block("plugin-code"))
    configs = tmp_path / "my_configs"
    for block in re.split(r"^# file: ", _readme_block("plugin-yaml"), flags=re.MULTILINE)[1:]:
        name, text = block.split("\n", 1)
        (configs / name).parent.mkdir(parents=True, exist_ok=True)
        (configs / name).write_text(text)
    run_dir = tmp_path / "run"
    command = _readme_block("plugin-command").replace("--config-dir=my_configs", f"--config-dir={configs}").split()
    assert command[:3] == ["rlvr", "train", f"--config-dir={configs}"]
    result = run_cli([*command[1:], *TINY, "trainer.max_steps=2", f"hydra.run.dir={run_dir}"],
                     cache=cache_dir, extra_env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    steps = _metrics(run_dir)
    assert "reward/shouting" in steps[1] and steps[1]["reward/mean"] >= 0
    typo = run_cli([*command[1:], *TINY, "+data.wrds=[a]", f"hydra.run.dir={tmp_path / 'typo'}"],
                   cache=cache_dir, extra_env={"PYTHONPATH": str(tmp_path)})
    assert typo.returncode == 1 and "data: my_pkg.plugin.Shout takes no key 'wrds'" in typo.stderr, typo.stderr[-2000:]
