"""The config reference (docs/reference.md) is generated from the schemas and the YAML files, and is
current; every key in it says what it does."""

from __future__ import annotations

import re
import typing

from rlvr import config_docs as reference
from rlvr.config import TrainConfig


def test_the_config_reference_is_current():
    assert reference.OUT.read_text() == reference.render(), \
        "docs/reference.md is out of date: regenerate it with `python -m rlvr.config_docs --write`"


def test_every_key_of_every_group_is_in_the_reference_with_what_it_does():
    text = reference.render()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([\w.]+)` \|.*\|.*\| (.*) \|$", text, re.M)}
    hints = typing.get_type_hints(TrainConfig)
    for group in reference.GROUP_LINES:
        if group == "data":
            continue  # per option (below)
        for key, _ in reference.fields(hints[group]):
            if key != "terms":
                assert f"{group}.{key}" in rows, f"{group}.{key}"
    for schema in reference.DATA_SCHEMAS.values():
        for key, _ in reference.fields(schema):
            assert f"data.{key}" in rows, key
    assert not [key for key, note in rows.items() if not note.strip()], "a key without a comment in its YAML"


def test_comments_are_read_with_their_nesting(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("# top\na: 1\nb:\n  # inner one\n  c: 2\n  # inner\n  # two lines\n  d: [1, 2]\ne: 3\n")
    assert reference.comments(path) == {"a": "top", "b.c": "inner one", "b.d": "inner two lines"}


def test_command_help_lists_the_groups_real_options_and_points_at_the_reference():
    from rlvr.cli import command_help

    for command in ("train", "eval"):
        text = command_help(command)
        assert "algorithm" in text and "options: dapo, dr_grpo, grpo*, gspo, rloo" in text
        assert "multiplication_4x2" in text and "docs/reference.md" in text
        assert "_schema" not in text and "_base" not in text and "_file" not in text
    assert command_help("train") != command_help("eval")  # each says what it does


def test_the_docs_site_builds_with_strict_checks(tmp_path):
    """mkdocs builds docs/ with --strict: a broken link, an anchor that is not there or a page left out
    of the nav fails."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from .conftest import REPO

    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def test_the_configuration_page_lists_every_group_with_its_options():
    """docs/configuration.md's group table: a row for every config group a user picks options of, naming
    each option there is (it once left out `sft` and `tools`)."""
    from .conftest import REPO

    text = (REPO / "docs" / "configuration.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.*?) \|", text, re.M)}
    groups = sorted(p.name for p in (REPO / "configs").iterdir() if p.is_dir() and p.name not in ("hydra", "experiment"))
    assert sorted(rows) == groups
    for group in groups:
        assert sorted(re.findall(r"`(\w+(?:\.\w+)?)`", rows[group])) == sorted(reference.options(group)), group
