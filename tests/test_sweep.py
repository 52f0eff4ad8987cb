"""The sweep summary of a multirun, from run dirs laid out as Hydra writes them: the CSV and the
printed table both name each run by its differing overrides, whole."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from rlvr.plot import differing_overrides
from rlvr.sweep import SweepSummary, summarise_sweep

SHARED = ["+experiment=multiplication", "model=tiny", "trainer.max_steps=1"]


def _run(sweep: Path, num: int, overrides: list[str], eval_accuracy: float) -> Path:
    """A finished job of the multirun: Hydra's .hydra/overrides.yaml (written as Hydra writes it) and summary.json."""
    run = sweep / str(num)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    (run / "summary.json").write_text(json.dumps({
        "steps": 1, "wall_s": 12.34, "last_step": {"reward/mean": 0.25},
        "first_eval": {"eval/accuracy": 0.125}, "final_eval": {"eval/accuracy": eval_accuracy}}))
    return run


def test_the_printed_table_names_every_run_whole(tmp_path, capsys, monkeypatch):
    # README: rlvr train -m +experiment=multiplication algorithm=grpo,dapo,dr_grpo seed=0,1
    sweep = tmp_path / "sweep"
    jobs = [(a, s) for a in ("grpo", "dapo", "dr_grpo") for s in (0, 1)]
    for num, (algorithm, seed) in enumerate(jobs):
        _run(sweep, num, [*SHARED, f"algorithm={algorithm}", f"seed={seed}"], eval_accuracy=0.5 - 0.05 * num)
    monkeypatch.setenv("COLUMNS", "80")  # what rich uses when the output is piped
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    printed = capsys.readouterr().out

    rows = (sweep / "sweep_summary.csv").read_text().splitlines()
    assert [r.split(",")[1] for r in rows[1:]] == [f"algorithm={a} seed={s}" for a, s in jobs]  # best first
    assert "…" not in printed  # rich cuts a cell that does not fit with "…" unless told to wrap it
    lines = [line for line in printed.splitlines() if line.startswith("│")]
    assert all(line.endswith("│") for line in lines)  # no line cropped at the console's edge
    for num, (algorithm, seed) in enumerate(jobs):
        first = next(i for i, line in enumerate(lines) if line.startswith(f"│ {num} "))
        rest = next((i for i, line in enumerate(lines[first + 1:], first + 1) if not line.startswith("│    ")),
                    len(lines))
        cells = list(zip(*(line.strip("│").split("│") for line in lines[first:rest]), strict=True))
        overrides = " ".join(part.strip() for part in cells[1] if part.strip())
        assert overrides == f"algorithm={algorithm} seed={seed}", printed
        assert [part.strip() for part in cells[-1]][0] == "12.3", printed  # wall_s, the last column


def test_overrides_are_read_as_yaml(tmp_path):
    """Hydra's writer quotes an override holding ': ' and folds one longer than 80 characters over
    two lines; both must come back as they were typed."""
    template = "data.prompt_template='{prompt} Put the final answer in \\boxed{}. Think step by step, briefly.'"
    a = _run(tmp_path, 0, [*SHARED, template, "data.system_prompt='a: b'", "seed=0"], 0.5)
    b = _run(tmp_path, 1, [*SHARED, "seed=1"], 0.5)
    assert len(template) > 80 and "\n  " in (a / ".hydra" / "overrides.yaml").read_text()  # folded
    assert differing_overrides([a, b]) == [f"{template} data.system_prompt='a: b' seed=0", "seed=1"]
    assert [r["overrides"] for r in summarise_sweep(tmp_path)] == differing_overrides([a, b])


def test_seeds_of_one_configuration_are_summarised_together(tmp_path):
    sweep = tmp_path / "sweep"
    finals = {("grpo", 0): 0.5, ("grpo", 1): 0.3, ("dapo", 0): 0.2, ("dapo", 1): 0.2}
    for num, ((algorithm, seed), accuracy) in enumerate(finals.items()):
        _run(sweep, num, [*SHARED, f"algorithm={algorithm}", f"seed={seed}"], eval_accuracy=accuracy)
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    header, *rows = [r.split(",") for r in (sweep / "sweep_seeds.csv").read_text().splitlines()]
    table = [dict(zip(header, r, strict=True)) for r in rows]
    assert [(r["config"], r["seeds"], r["final_mean"], r["final_std"], r["gain_min"]) for r in table] == [
        ("algorithm=grpo", "2", "0.4", "0.1414", "0.175"), ("algorithm=dapo", "2", "0.2", "0.0", "0.075")]
    assert table[0]["finals"] == "0.500 0.300" and table[0]["start_mean"] == "0.125"


def test_no_seed_table_without_repeated_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    for num, lr in enumerate(("1e-5", "3e-5")):
        _run(sweep, num, [*SHARED, f"optim.lr={lr}"], eval_accuracy=0.5)
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert (sweep / "sweep_summary.csv").is_file() and not (sweep / "sweep_seeds.csv").exists()
