"""The cold start (`rlvr sft`, and the `sft` stage of `rlvr train`'s recipe): demonstrations as the rollouts'
token ids, the loss on the assistant's tokens only, packing equal to padded rows, bad input refused
before the model loads, held-out problems never shown, and the recipe resumed after a kill in either
stage — with the real CLI, learner and engine on the tiny model."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from rlvr.algorithms import objective
from rlvr.data import is_held_out
from rlvr.data.multiplication import MultiplicationTask, written_out
from rlvr.rollout.multiturn import ToolRollouts, build_tools
from rlvr.sft import Demonstrations, SftDataError

from .conftest import REPO, cli_here, compose_config, run_cli
from .test_checkpoint import _start, _wait_for_step

TINY = ["+experiment=multiplication", "model=tiny", "data.eval_size=4", "rollout.max_tokens=48"]


def _demonstrations(tiny_path: Path, overrides: list[str], cache: Path) -> Demonstrations:
    from transformers import AutoTokenizer

    from rlvr.data import build_task

    cfg = compose_config(["model=tiny", *overrides], cache)
    tools = build_tools(cfg.tools, cfg.rollout)
    return Demonstrations(build_task(cfg), cfg, AutoTokenizer.from_pretrained(tiny_path), tools)


@pytest.mark.parametrize("demonstration", ["written", "calculator"])
def test_demonstrations_are_the_token_ids_a_rollout_of_the_same_answer_holds(demonstration, tiny_path, cache_dir):
    """Prompt + completion decode to the chat template's own rendering of the whole conversation, and
    the loss mask covers exactly the assistant's own text and the token that ends its turn."""
    tools = ["tools=calculator"] if demonstration == "calculator" else []
    demos = _demonstrations(tiny_path, ["+experiment=multiplication_4x2", *tools,
                                        f"data.demonstration={demonstration}"], cache_dir)
    tok, box = demos.tokenizer, demos.tools
    for r in demos.next(4):
        a, b = r.prompt.meta["operands"]
        if demonstration == "written":
            answer = [{"role": "assistant", "content": written_out(a, b)}]
        else:
            call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}</tool_call>'
            answer = [{"role": "assistant", "content": call}, {"role": "tool", "content": str(a * b)},
                      {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]
        conversation = [*r.prompt.messages, *answer]
        if box is not None:  # presented as the rollouts present them (the tiny template has no tools=)
            conversation[0] = {"role": "system", "content": conversation[0]["content"] + "\n\n" + box.instructions()}
        whole = tok.apply_chat_template(conversation, tokenize=False)
        assert tok.decode(r.prompt_ids + r.completion_ids) == whole.removesuffix("\n")
        learned = tok.decode([t for t, m in zip(r.completion_ids, r.completion_mask, strict=True) if m])
        answers = [m["content"] for m in conversation if m["role"] == "assistant"]
        assert learned == "".join(answers) + tok.eos_token
        if demonstration == "calculator":  # between the turns: exactly what the rollouts append after a call
            turns = ToolRollouts(None, tok, box, 64, 3, None, 1024)
            assert turns.tool_turn_ids(str(a * b)) == [t for t, m in zip(r.completion_ids, r.completion_mask,
                                                                         strict=True) if not m]


def test_task_demonstrations_never_show_a_held_out_problem():
    task = MultiplicationTask(levels=[[2, 1], [4, 2]], template="{a} * {b}?", eval_fraction=0.1)
    held = {tuple(p.meta["operands"]) for p in task.eval_prompts()}
    for level in (0, 1):
        task.level = level
        shown = [tuple(d.prompt.meta["operands"]) for d in task.demonstrations(500)]
        assert not held & set(shown)
        assert not any(is_held_out(f"{a}*{b}", 0.1) for a, b in shown)


def _write(path: Path, rows: list) -> Path:
    """`rows` as JSONL; a row that is "" stands for a blank line."""
    path.write_text("".join((json.dumps(r) if r != "" else "") + "\n" for r in rows))
    return path


def test_dataset_rows_asking_a_held_out_prompt_are_dropped(tmp_path, tiny_path, cache_dir):
    cfg = compose_config(["model=tiny", "+experiment=multiplication"], cache_dir)
    from rlvr.data import build_task

    held = build_task(cfg).eval_prompts()[0].messages[-1]["content"]
    data = _write(tmp_path / "d.jsonl", [{"prompt": held, "completion": "<answer>1</answer>"},
                                         {"prompt": "What is 2 * 3?", "completion": "<answer>6</answer>"}])
    demos = _demonstrations(tiny_path, ["+experiment=multiplication", f"sft.data={data}"], cache_dir)
    assert [d.prompt.messages[-1]["content"] for d in demos.rows] == ["What is 2 * 3?"]
    # an error names the row of the file, whatever was dropped before it
    data = _write(tmp_path / "e.jsonl", [{"prompt": held, "completion": "<answer>1</answer>"},
                                         {"prompt": "What is 2 * 3?", "completion": "6 " * 300}])
    with pytest.raises(SftDataError, match="line 2: "):
        _demonstrations(tiny_path, ["+experiment=multiplication", f"sft.data={data}", "rollout.max_model_len=256"],
                        cache_dir)


CHAT = {"messages": [{"role": "user", "content": "What is 2 * 3?"}, {"role": "assistant", "content": "6"}]}


@pytest.mark.parametrize("rows, overrides, error", [
    ([], [], "has no rows"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], [], "demos.jsonl', line 1: no assistant message"),
    # the line a user opens in an editor, as the data loader's messages count (blank lines too)
    ([CHAT, "", {"text": "hi"}], [], r"line 3: no column 'messages' \(sft.messages_key\)"),
    ([CHAT, {"messages": [*CHAT["messages"], {"role": "user", "content": "and?"}]}], [],
     "line 2: the conversation ends with a user message"),
    ([CHAT, {"messages": [CHAT["messages"][0], {"role": "assistant", "content": "6 " * 300}]}],
     ["rollout.max_model_len=256"], r"line 2: \d+ tokens under the chat template, longer than the context "
                                    r"rollout.max_model_len=256"),
    ([{"messages": [{"role": "bot", "content": "6"}]}], [], "role must be one of"),
    ([{"messages": [CHAT["messages"][0], {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "calculator", "arguments": '{"expression": "2 * 3"}'}}]},
        {"role": "tool", "content": "6"}, {"role": "assistant", "content": "<answer>6</answer>"}]}], [],
     "line 1: a tool's result, but no tools are configured"),
])
def test_bad_demonstrations_fail_before_the_model_loads_naming_the_row(rows, overrides, error, tmp_path, cache_dir):
    data = _write(tmp_path / "demos.jsonl", rows)
    result = cli_here(["sft", *TINY, "sft.steps=2", f"sft.data={data}", *overrides,
                       f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1
    assert re.search(error, result.stderr), result.stderr[-2000:]
    assert "learner:" not in result.stderr  # before the model loads
    assert not (tmp_path / "run").exists()


def test_a_template_that_cannot_render_tool_messages_is_refused(tmp_path, tiny_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}"
                         "{% endif %}{{ m.content }}{% endfor %}")
    cfg = compose_config(["model=tiny", "+experiment=multiplication_tool", "data.demonstration=calculator"])
    from rlvr.data import build_task

    with pytest.raises(SftDataError, match="cannot render a tool message.*no tool role"):
        Demonstrations(build_task(cfg), cfg, tok, build_tools(cfg.tools, cfg.rollout))


def test_a_task_without_demonstrations_is_named(tmp_path, cache_dir):
    data = _write(tmp_path / "problems.jsonl", [{"prompt": f"Say {i}", "answer": str(i)} for i in range(10)])
    result = cli_here(["sft", "data=jsonl", f"data.path={data}", "reward=exact", "model=tiny", "sft.steps=2",
                       f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1 and "sft.data=task: the task DatasetTask" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("command, args, said", [
    ("sft", ["sft.steps=5"], "cold start: sft.warmup_steps=10 is longer than sft.steps=5: the learning rate never "
                             "gets above 50% of its value"),
    ("train", ["trainer.max_steps=3", "optim.warmup_steps=4"],
     "RL: optim.warmup_steps=4 is longer than trainer.max_steps=3: the learning rate never gets above 75%"),
])
def test_a_stage_shorter_than_its_warmup_is_warned_about_at_start(command, args, said, tmp_path, cache_dir):
    """sft.warmup_steps defaults to 10: a 5-step cold start would train at half of sft.lr at most, silently.
    (The model folder is missing, so the run stops right after the warning.)"""
    result = cli_here([command, *TINY, *args, "model=local", f"model.path={tmp_path / 'absent'}",
                       f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1 and "does not exist" in result.stderr, result.stderr[-2000:]
    assert said in result.stderr and "set " in result.stderr


def test_rlvr_sft_needs_steps(tmp_path, cache_dir):
    result = cli_here(["sft", *TINY, f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert result.returncode == 1 and "sft.steps: rlvr sft needs >= 1" in result.stderr


def _one_step(tiny_path, cache_dir, packing: bool) -> tuple[float, dict[str, torch.Tensor]]:
    from rlvr.learner import Learner, make_batch

    cfg = compose_config([*TINY, "sft.lr=1e-3", "sft.warmup_steps=0", "learner.micro_batch_size=3"], cache_dir)
    torch.manual_seed(0)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 48, "cpu", schedule=cfg.schedule("sft"),
                      shared_prefix=packing)
    demos = _demonstrations(tiny_path, TINY, cache_dir).next(8)
    out = learner.step(make_batch(sorted(demos, key=lambda r: len(r.completion_ids)), learner.policy.pad_id), objective.SFT())
    return out["loss"], {k: v.detach().clone() for k, v in learner.policy.model.named_parameters()}


def test_packed_rows_give_the_loss_and_update_of_padded_rows(tiny_path, cache_dir):
    loss_packed, packed = _one_step(tiny_path, cache_dir, True)
    loss_padded, padded = _one_step(tiny_path, cache_dir, False)
    assert loss_packed == pytest.approx(loss_padded, rel=1e-5)
    assert max((packed[k] - padded[k]).abs().max().item() for k in packed) < 1e-6


# --- the real CLI -------------------------------------------------------------------------------

SFT = [*TINY, "sft.steps=6", "sft.batch_size=8", "sft.lr=3e-3", "sft.warmup_steps=0", "sft.save_every=2",
       "learner.precision=fp32"]
RECIPE = [*SFT, "recipe=[sft,rl]", "trainer.max_steps=4", "trainer.save_every=2", "data.batch_size=2", "algorithm.group_size=4",
          "reward=digits", "optim.lr=1e-4"]


TAUGHT = [(12, 34), (56, 71), (81, 93), (27, 45)]


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "time/step_s" in r]


@pytest.mark.slow
def test_rlvr_sft_learns_the_demonstrations_and_rlvr_train_starts_from_its_model(tmp_path, cache_dir):
    """Four chat rows, shown every step: the loss falls; the engine takes the weights of each step that an
    evaluation follows, and serves them exactly; the model it writes is where RL starts."""
    data = _write(tmp_path / "demos.jsonl", [
        {"messages": [{"role": "user", "content": f"What is {a} * {b}?"},
                      {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]} for a, b in TAUGHT])
    run_dir = tmp_path / "sft"
    result = run_cli(["sft", *SFT, f"sft.data={data}", "sft.batch_size=4", "sft.eval_every=4", f"hydra.run.dir={run_dir}"],
                     cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packing off (sft.packing=False" in result.stdout + result.stderr  # the learner said in the cold start's words
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert steps[-1]["loss"] < 0.8 * steps[0]["loss"]  # it learns the demonstrations (6.2 -> 4.3 here)
    synced = [s for s in steps if "sync/logprob_max_diff" in s]  # the steps an evaluation follows, and only those
    assert [s["step"] for s in synced] == [4, 6] and all(s["sync/logprob_max_diff"] < 1e-3 for s in synced)
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in r]
    assert [e["step"] for e in evals] == [0, 4, 6]
    assert (run_dir / "curves.png").is_file() and (run_dir / "model" / "config.json").is_file()
    rl = run_cli(["train", *RECIPE, "recipe=[rl]", "sft.steps=0", "model=local", f"model.path={run_dir / 'model'}",
                  f"hydra.run.dir={tmp_path / 'rl'}"], cache=cache_dir)
    assert rl.returncode == 0, rl.stderr[-3000:]
    # the console names the model folder the run loaded
    assert f"model: {run_dir / 'model'}" in rl.stdout + rl.stderr
    # a run shorter than trainer.samples_every (5) still writes its samples, after its last step (4)
    samples = [json.loads(x) for x in (tmp_path / "rl" / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["step"] for s in samples} == {4}


def _evaluations(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in r]


@pytest.mark.slow
def test_the_cold_start_ends_where_pass_at_group_size_stops_rising_and_rl_starts_there(tmp_path, cache_dir):
    """sft.plateau_patience: every evaluation also samples G answers a held-out prompt; the cold start
    ends at the first evaluation where pass@G has not risen by plateau_gain over its best (patience 1),
    writes its model there, and RL starts from it. Every answer passes here (a reward any non-blank
    answer earns), so pass@G reaches its ceiling at once and the cold start stops at its first
    evaluation after that, long before sft.steps."""
    run_dir = tmp_path / "run"
    result = run_cli(["train", *RECIPE, "sft.steps=12", "sft.eval_every=2", "sft.plateau_patience=1",
                      "reward.terms.digits._target_=tests.slow_rewards.answered", "trainer.max_steps=2",
                      f"hydra.run.dir={run_dir}"], cache=cache_dir, extra_env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    sft = run_dir / "sft"
    evals = _evaluations(sft)
    assert all("eval/pass@4" in e for e in evals)  # at the RL group size, algorithm.group_size=4
    best, ended = 0.0, None  # the rule, written out: the first evaluation after a rise that does not rise
    for e in evals:
        if e["eval/pass@4"] >= best + 0.02:
            best = e["eval/pass@4"]
        elif best > 0:
            ended = e["step"]
            break
    assert ended is not None and ended < 12, evals
    assert [s["step"] for s in _steps(sft)] == list(range(1, ended + 1))  # no step after it
    assert [e["step"] for e in evals][-1] == ended  # its evaluation is the final one, logged once
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["steps"] == ended and summary["final_eval"]["eval/pass@4"] == evals[-1]["eval/pass@4"]
    assert f"eval/pass@4 {evals[-1]['eval/pass@4']:.3f} after step {ended}" in result.stderr
    assert (sft / "model" / "config.json").is_file()
    assert json.loads((run_dir / "manifest.json").read_text())["model_path"] == str(sft / "model")
    assert [s["step"] for s in _steps(run_dir)] == [1, 2]


def test_a_resumed_cold_start_counts_the_evaluations_it_logged_before(tmp_path):
    """A cold start resumed from a checkpoint counts the pass@G its metrics.jsonl holds up to that step;
    one resumed where the plateau had been reached ends there, its logged evaluation the final one."""
    from rlvr.loop import Plateau

    records = [{"step": 0, "eval/pass@4": 0.0}, {"step": 2, "loss": 1.0}, {"step": 2, "eval/pass@4": 0.5},
               {"step": 4, "eval/pass@4": 0.5, "eval/accuracy": 0.25}, {"step": 6, "eval/pass@4": 0.75}]
    metrics = _write(tmp_path / "metrics.jsonl", records)
    before = Plateau(4, patience=2, gain=0.02)
    assert before.replay(metrics, 4) is None  # one flat evaluation of the two the patience asks
    assert before.reached(6, {"eval/pass@4": 0.51})  # the second: it ends at step 6
    assert Plateau(4, patience=1, gain=0.02).replay(metrics, 4) == {"eval/pass@4": 0.5, "eval/accuracy": 0.25}
    assert Plateau(4, patience=1, gain=0.02).replay(metrics, 2) is None  # (step 4's came after the checkpoint)


def _kill_at(proc, run_dir: Path, step: int) -> None:
    """SIGKILL the run (its whole process group) once `run_dir` has logged `step`."""
    _wait_for_step(proc, run_dir, step)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_the_recipe_resumes_after_ctrl_c_or_a_kill_in_either_stage(tmp_path, cache_dir):
    """`rlvr train` with recipe=[sft,rl] runs the cold start into <run dir>/sft, then RL from its model.
    Ctrl-C in the cold start finishes the step, checkpoints and prints the command that resumes the whole
    recipe; the cold start's checkpoint given to RL (what that hint once said) is refused in one line
    before anything is written; killed in RL, the same command with trainer.resume=auto finishes both,
    each step run once, RL started from the cold start's model."""
    run_dir = tmp_path / "run"
    args = [*RECIPE, f"hydra.run.dir={run_dir}"]
    proc = _start(args, cache_dir)
    _wait_for_step(proc, run_dir / "sft", 2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert f"Continue with the same command plus trainer.resume=auto hydra.run.dir={run_dir}\n" in out, out[-3000:]
    assert not (run_dir / "sft" / "model").exists() and not (run_dir / "metrics.jsonl").exists()
    saved = sorted((run_dir / "sft" / "checkpoints").glob("step-*"))[-1]
    state = json.loads((saved / "trainer_state.json").read_text())
    assert state["stage"] == "sft" and state["written_by"] == {"run_dir": str(run_dir), "command": "train"}

    before = _snapshot(run_dir)
    for wrong in ([f"trainer.resume={saved}", f"hydra.run.dir={run_dir / 'sft'}"],  # the old hint, literally
                  ["trainer.resume=auto", f"hydra.run.dir={run_dir / 'sft'}"]):  # the stage's own dir
        refused = cli_here(["train", *RECIPE, *wrong], cache_dir)
        lines = [x for x in (refused.stdout + refused.stderr).splitlines() if x.strip()]
        assert refused.returncode == 1 and len(lines) == 1, lines
        assert "is a checkpoint of a cold start, and this run is RL" in lines[0]
        assert f"continue the whole recipe with the same command plus trainer.resume=auto hydra.run.dir={run_dir}" \
            in lines[0]
    assert _snapshot(run_dir) == before and not (run_dir / "sft" / "sft").exists()  # nothing written

    _kill_at(_start([*args, "trainer.resume=auto"], cache_dir), run_dir, 3)
    assert [s["step"] for s in _steps(run_dir / "sft")] == list(range(1, 7))
    rl_saved = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    refused = cli_here(["sft", *SFT, f"trainer.resume={rl_saved}", f"hydra.run.dir={run_dir / 'sft'}"], cache_dir)
    assert refused.returncode == 1 and "is a checkpoint of RL (rlvr train), and this run is a cold start" in \
        refused.stderr, refused.stderr[-2000:]
    result = run_cli(["train", *args, "trainer.resume=auto"], cache=cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cold start: done already" in result.stderr
    assert [s["step"] for s in _steps(run_dir)] == list(range(1, 5))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["model_path"] == str(run_dir / "sft" / "model")
    assert (run_dir / "model" / "config.json").is_file()


def test_openai_tool_calls_in_a_dataset_are_written_as_the_rollouts_write_them(tmp_path, tiny_path, cache_dir):
    """A chat row whose assistant message carries `tool_calls` gives the very answer tokens of the task's
    own calculator demonstration of the same problem."""
    tools = ["+experiment=multiplication_tool", "data.demonstration=calculator"]
    task_demo = _demonstrations(tiny_path, tools, cache_dir).next(1)[0]
    a, b = task_demo.prompt.meta["operands"]
    row = {"messages": [{"role": "user", "content": f"What is {a} * {b}?"},
                        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                            "name": "calculator", "arguments": json.dumps({"expression": f"{a} * {b}"})}}]},
                        {"role": "tool", "content": str(a * b)},
                        {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]}
    data = _write(tmp_path / "calls.jsonl", [row])
    from_file = _demonstrations(tiny_path, [*tools, f"sft.data={data}"], cache_dir).next(1)[0]
    assert from_file.completion_ids == task_demo.completion_ids
    assert from_file.completion_mask == task_demo.completion_mask
