"""Every `rlvr train` / `rlvr eval` command in the code blocks of README.md and docs/*.md composes as a
shell would pass it, and passes the checks a run makes before anything loads (values, combinations,
unknown keys); every `rlvr plot` command draws, every `make` command names a target of the Makefile,
and every `python scripts/…` command names a script, options it takes and keys the schema has."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from rlvr.cli import CONFIG_DIR
from rlvr.config import check
from rlvr.keys import check_overrides, unknown_keys

from .conftest import REPO, cli_here, compose_config, compose_dictconfig

# Placeholders a reader fills in, and what stands in for them here (compose does not touch the paths).
FILLED = {"outputs/…/model": "/tmp/rlvr-readme/run/model", "<same dir>": "/tmp/rlvr-readme/run"}
# Hydra's command-line flags: they choose what to do with the composed config, not what it holds.
FLAGS = {"--help", "--cfg", "-m", "--multirun"}


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_commands(pattern: str = r"rlvr (train|sft|eval)\b") -> list[str]:
    """The command lines of the code blocks (fenced, or indented by four spaces) of README.md and the
    docs that start with `pattern` (`rlvr train|eval`), with backslash continuations joined."""
    commands = []
    for page in PAGES:
        commands += _commands(page.read_text(), pattern)
    return commands


def _commands(text: str, pattern: str) -> list[str]:
    commands, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ") or pending):
            continue
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):  # the shell joins the next line
            pending = line[:-1]
            continue
        if re.match(pattern, line):
            commands.append(line)
    return commands


COMMANDS = readme_commands()


def overrides_of(command: str) -> list[list[str]] | str:
    """The override lists `command` runs with (one per job of a multirun), as the shell splits it;
    or why it cannot be composed here."""
    for placeholder, value in FILLED.items():
        command = command.replace(placeholder, value)
    args = shlex.split(command, comments=True)[2:]
    if "..." in args:
        return "'...' stands for the reader's own overrides"
    if any(a.startswith("--config-dir") for a in args):
        return "a config dir of the reader's own: tests/test_tasks_e2e.py runs this example"
    # <...> is a placeholder, except the answer tags a prompt template asks for
    assert not [a for a in args if "…" in a or re.search(r"<(?!/?answer>)[^>]*>", a)], \
        f"unfilled placeholder in {command!r}"
    multirun = bool({"-m", "--multirun"} & set(args))
    args = [a for i, a in enumerate(args) if a not in FLAGS and not (i and args[i - 1] == "--cfg")]
    parsed = OverridesParser.create().parse_overrides(args)
    if not multirun:
        return [args]
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def test_the_readme_commands_are_found():
    assert len(COMMANDS) >= 20, COMMANDS
    assert any(c.startswith("rlvr eval") for c in COMMANDS) and any(" -m " in c for c in COMMANDS)
    assert not [c for c in COMMANDS if c.endswith("\\")]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split("#")[0].strip() for c in COMMANDS])
def test_a_readme_command_composes_and_passes_the_checks(command):
    jobs = overrides_of(command)
    if isinstance(jobs, str):
        pytest.skip(jobs)
    for overrides in jobs:
        check_overrides(overrides, Path(CONFIG_DIR), [])
        unknown_keys(compose_dictconfig(overrides))
        check(compose_config(overrides))


def test_the_prompt_template_arrives_as_written():
    """Braces and a backslash survive the shell and Hydra's override grammar."""
    [command] = [c for c in COMMANDS if "data.prompt_template=" in c]
    [overrides] = overrides_of(command)
    assert compose_config(overrides).data.prompt_template == r"{prompt} Put the final answer in \boxed{}."


def test_every_make_command_names_a_target():
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    made = readme_commands(r"make \w")
    assert made
    for command in made:
        assert shlex.split(command, comments=True)[1] in targets, command


def script_commands() -> list[str]:
    """`python scripts/…` as the pages write it: in code blocks, or inline in `backticks`."""
    inline = [c for page in PAGES for c in re.findall(r"`(python scripts/[^`]+)`", page.read_text())]
    return readme_commands(r"python scripts/") + inline


SCRIPT_COMMANDS = script_commands()


@pytest.mark.parametrize("command", SCRIPT_COMMANDS, ids=[c.split("#")[0].strip() for c in SCRIPT_COMMANDS])
def test_a_script_command_names_a_script_its_options_and_known_keys(command):
    """These run for minutes, so each is checked for its syntax only: the script exists, takes every
    option written, and every config override names a key of the schema (the `[--steps N]` a reader
    fills in included)."""
    script, *args = shlex.split(command.replace("[", " ").replace("]", " "), comments=True)[1:]
    source = (REPO / script).read_text()
    options = [a.split("=")[0] for a in args if a.startswith("--")]
    for option in options:
        assert f'add_argument("{option}"' in source, f"{script} takes no {option}: {command!r}"
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    if overrides:
        assert "overrides" in source, f"{script} takes no config overrides: {command!r}"
        check_overrides(overrides, Path(CONFIG_DIR), [])
        unknown_keys(compose_dictconfig(overrides))


def test_the_script_commands_are_found():
    assert len(SCRIPT_COMMANDS) >= 10, SCRIPT_COMMANDS


def test_every_plot_command_draws(tmp_path, cache_dir):
    """`rlvr plot` as the docs write it, on run dirs of a few logged steps in place of theirs."""
    commands = readme_commands(r"rlvr plot ")
    assert commands
    for k, command in enumerate(commands):
        args = shlex.split(command, comments=True)[2:]
        if any(a.startswith("[") or "…" in a for a in args):
            continue  # a placeholder for the reader's run dirs
        where = tmp_path / str(k)
        for a in args:
            if a.startswith("outputs/"):
                run = where / a
                run.mkdir(parents=True)
                (run / "metrics.jsonl").write_text("".join(
                    json.dumps({"step": s, "reward/mean": 0.1 * s, "accuracy": 0.1 * s, "time/step_s": 1.0}) + "\n"
                    for s in range(1, 4)))
        result = cli_here(["plot", *args], cache=cache_dir, cwd=where)
        assert result.returncode == 0, result.stdout + result.stderr
        out = args[args.index("--out") + 1] if "--out" in args else f"{args[0]}/curves.png"
        assert (where / out).is_file(), command
