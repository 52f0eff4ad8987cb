"""The config reference (docs/reference.md), generated from the schemas and the YAML files:

    python -m rlvr.config_docs            # print it
    python -m rlvr.config_docs --write    # write docs/reference.md (tests/test_docs.py checks it is current)

Every key of every group: its type and choices (rlvr/config.py, rlvr/config_data.py), its default (the YAML of the group's
default option, `configs/train.yaml`'s defaults list) and what it does (the comment above it in that
YAML). Options of a group that add keys of their own (a dataset's columns, a task's knobs) get a table
of their own keys.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlvr.choices import Choice
from rlvr.config import TrainConfig
from rlvr.config_data import (
    BfclDataConfig,
    FileDataConfig,
    FunctionPickingDataConfig,
    MixtureDataConfig,
    MultiplicationDataConfig,
    SamplingConfig,
)
from rlvr.keys import group_options

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
OUT = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
# Data options with a schema of their own: the keys beyond every task's.
DATA_SCHEMAS = {"multiplication": MultiplicationDataConfig, "function_picking": FunctionPickingDataConfig,
                "bfcl": BfclDataConfig, "jsonl": FileDataConfig, "mixture": MixtureDataConfig}
GROUP_LINES = {
    "model": "The policy: a Hugging Face folder, how to build it, LoRA.",
    "data": "The task: where prompts come from, prompts per step, the held-out split.",
    "reward": "The reward terms (each a function named by `_target_`) and how they combine.",
    "algorithm": "The RL algorithm: group size, advantages, ratio, clipping, aggregation, KL, DAPO's filters.",
    "rollout": "Generation: the engine, sampling, context, the tool turns.",
    "optim": "AdamW and its schedule.",
    "trainer": "The loop: steps, evaluation, samples, checkpoints, resume.",
    "learner": "How the policy computes its update.",
    "launch": "Where the run runs: device, threads, processes, machines.",
    "eval": "`rlvr eval`'s sampled evaluation.",
    "sft": "The supervised cold start: `rlvr sft`, and the `sft` stage of a recipe.",
    "dpo": "Preference tuning (DPO, SimPO): the `dpo` stage of a recipe.",
    "logger": "Weights & Biases.",
}


def comments(path: Path) -> dict[str, str]:
    """The comment above each key of a YAML file, by dotted key (nested keys by their indentation)."""
    out, pending, stack = {}, [], []  # stack: (indent, key) of the mappings we are in
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z_][\w]*):", line)
        if not match or stripped.startswith("- "):
            pending = []
            continue
        indent, key = len(match.group(1)), match.group(2)
        stack = [(i, k) for i, k in stack if i < indent]
        dotted = ".".join([k for _, k in stack] + [key])
        if pending:
            out[dotted] = " ".join(pending)
        pending = []
        stack.append((indent, key))
    return out


def yaml_values(path: Path) -> dict[str, Any]:
    return {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}


def defaults_list() -> dict[str, str]:
    """Group -> its default option, from configs/train.yaml."""
    out = {}
    for entry in yaml.safe_load((CONFIGS / "train.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            (group, option), = entry.items()
            if "/" not in group and not group.startswith("override"):
                out[group] = option
    return out


def type_name(kind: Any) -> tuple[str, str]:
    """(type, choices) of a schema field's annotation, for the table."""
    if isinstance(kind, type) and issubclass(kind, Choice):
        return "choice", " \\| ".join(f"`{c.value}`" for c in kind)
    if kind is Any:
        return "any", ""
    args = typing.get_args(kind)
    if type(kind) is types.UnionType or typing.get_origin(kind) is typing.Union:
        return " or ".join(type_name(a)[0] for a in args), ""
    if args:  # list[int], dict[str, Any]
        return f"{kind.__origin__.__name__} of {', '.join(type_name(a)[0] for a in args)}", ""
    return {"NoneType": "null"}.get(kind.__name__, kind.__name__), ""


def fields(schema: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, annotation) of every leaf field of a dataclass schema."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += fields(kind, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", kind))
    return out


def _default(values: dict, key: str) -> str:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ""
        node = node[part]
    text = "null" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
    text = text.replace("\n", "\\n").replace("|", "\\|")
    return f"`{text}`" if len(text) < 60 else f"`{text[:57]}...`"


def _yaml_with_bases(group: str, option: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Values and comments of `configs/<group>/<option>.yaml` merged over the files it lists in its
    defaults (the _base of models, grpo under the other algorithms)."""
    path = CONFIGS / group / f"{option}.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for base in data.get("defaults", []):
        if isinstance(base, str) and (CONFIGS / group / f"{base}.yaml").is_file():
            more, more_notes = _yaml_with_bases(group, base)
            values.update(more)
            notes.update(more_notes)
    values.update(yaml_values(path))
    notes.update(comments(path))
    return values, notes


def table(group: str, option: str, keys: list[tuple[str, Any]]) -> list[str]:
    values, notes = _yaml_with_bases(group, option)
    lines = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for key, kind in keys:
        kind_text, choices = type_name(kind)
        note = notes.get(key, "")
        if choices:
            kind_text = f"{kind_text}: {choices}"
        lines.append(f"| `{group}.{key}` | {kind_text} | {_default(values, key)} | {note.replace('|', '/')} |")
    return lines


def reward_terms_table() -> list[str]:
    """Each `reward=` option's terms, with their functions and weights, and its correct term."""
    lines = ["| option | terms: function (weight) | `correct_term` |", "|---|---|---|"]
    for option in options("reward"):
        values, _ = _yaml_with_bases("reward", option)
        terms = "; ".join(f"`{name}`: `{term['_target_']}` ({term['weight']:g})"
                          for name, term in values.get("terms", {}).items())
        lines.append(f"| `{option}` | {terms} | `{values.get('correct_term')}` |")
    return lines


def options(group: str) -> list[str]:
    return group_options(group, [CONFIGS])


def render() -> str:
    hints = typing.get_type_hints(TrainConfig)
    chosen = defaults_list()
    out = ["# Config reference", "",
           "Generated by `python -m rlvr.config_docs --write` from the schemas in `rlvr/config.py` and",
           "`rlvr/config_data.py` and the YAML files in `configs/` (do not edit by hand; the tests check that it is",
           "current). Each group's default option is the one `configs/train.yaml` lists; pick another with",
           "`GROUP=OPTION`, set a key with `GROUP.KEY=VALUE`.", ""]
    for group, line in GROUP_LINES.items():
        default = chosen.get(group)
        out += [f"## `{group}`", "", line, "",
                f"Options: {', '.join(f'`{o}`' + (' (default)' if o == default else '') for o in options(group))}.", ""]
        schema = hints[group]
        if group == "data":
            for option, data_schema in DATA_SCHEMAS.items():
                label = "a file (`jsonl`, `json`, `csv`, `parquet`, `hf`)" if option == "jsonl" else f"`{option}`"
                keys = [(k, t) for k, t in fields(data_schema) if not k.startswith("sampling.")]
                out += [f"### data={label}", "", *table("data", option, keys), ""]
            out += ["### data.sampling (every option)", "", "How each step draws its training prompts from the task "
                    "(docs/tasks.md#difficulty-aware-sampling).", "",
                    *table("data", "_sampling", fields(SamplingConfig, "sampling.")), ""]
            continue
        if group == "reward":
            out += ["Every option sets `reward.terms.NAME: {_target_, weight, kwargs}` and `reward.correct_term`:",
                    "", *reward_terms_table(), "",
                    "Drop a term with `'~reward.terms.NAME'`, change its weight with `reward.terms.NAME.weight=W`, add",
                    "one with `+reward.terms.NAME._target_=...` (docs/rewards.md). The settings below are shared.", ""]
        out += [*table(group, default, [(k, t) for k, t in fields(schema) if k != "terms"]), ""]
    out += ["## Run-wide keys", "", "| key | type | default | what it does |", "|---|---|---|---|"]
    notes, values = comments(CONFIGS / "train.yaml"), yaml_values(CONFIGS / "train.yaml")
    for key in ("recipe", "seed", "cache_dir"):
        out.append(f"| `{key}` | {type_name(hints[key])[0]} | {_default(values, key)} | {notes.get(key, '')} |")
    out += ["", "Tools (`tools=calculator`, `tools=python`, `tools=[calculator,python]`) add `tools.NAME: {_target_,",
            "description, parameters, kwargs}`; their limits are `rollout.max_turns`, `rollout.max_total_tokens`,",
            "`rollout.tool_timeout_s` and `rollout.tool_output_chars`.", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--write" in argv:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
