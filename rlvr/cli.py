"""`rlvr <command> [hydra overrides]`.

    rlvr train +experiment=multiplication optim.lr=3e-6      # one run
    rlvr train -m +experiment=multiplication seed=0,1,2       # a sweep (Hydra multirun)
    rlvr train --help                                         # the config groups, their options, the docs
    rlvr sft +experiment=multiplication_4x2_sft               # the supervised cold start alone
    rlvr eval +experiment=multiplication model=local model.path=outputs/.../model   # greedy + pass@k
    rlvr plot RUN_DIR [RUN_DIR ...]                           # curves of runs, overlaid, as a PNG
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlvr.config import register, typed
from rlvr.errors import ConfigError, RlvrError
from rlvr.keys import check_overrides, unknown_keys
from rlvr.rundir import RunDirError, refuse_early, remove_if_untouched

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")

USAGE = """usage: rlvr <command> [hydra overrides]

Reinforcement learning from verifiable rewards (GRPO and descendants) with vLLM rollouts.

commands:
  train     run RL training, or the recipe's stages (recipe=[sft,dpo,rl]):
            rlvr train +experiment=multiplication [key=value ...]
            sweep with -m:    rlvr train -m +experiment=multiplication seed=0,1,2
            all options:      rlvr train --help   (config groups and their options)
                              rlvr train --cfg job (the composed config, nothing runs)
                              docs/reference.md   (every key: type, default, choices, meaning)
  sft       the supervised cold start alone (imitate demonstrations); writes <run dir>/model, which
            rlvr train starts from with model=local model.path=...; a recipe runs the cold start, then
            RL, in one run dir: rlvr train +experiment=multiplication_4x2_sft (recipe: [sft, rl])
  eval      greedy accuracy and pass@k of a model on a task's held-out prompts; any train override works:
            rlvr eval +experiment=multiplication model=local model.path=outputs/.../model eval.n_samples=8
            writes eval.json and eval_samples.jsonl into its run dir
  plot      training curves of one or more runs, overlaid, into a PNG:
            rlvr plot outputs/2026-11-30/14-00-00 [more run dirs] [--out curves.png]

examples:
  rlvr train +experiment=multiplication model=tiny trainer.max_steps=3
  rlvr train +experiment=multiplication optim.lr=1e-5 algorithm.group_size=8 data.batch_size=8

docs: README.md, then docs/ (or `make docs` for the site)
"""

WHAT = {"train": "Run RL training (GRPO and descendants) with vLLM rollouts; writes into its run dir. A recipe "
                 "(recipe=[sft,dpo,rl]) runs its stages in order: the supervised cold start, preference tuning, "
                 "RL; each but the last into <run dir>/<stage>.",
        "sft": "The supervised cold start alone: the policy imitates demonstrations (sft.*); writes <run dir>/model.",
        "eval": "Greedy accuracy and pass@k of a model on a task's held-out prompts; writes eval.json and "
                "eval_samples.jsonl."}


def command_help(command: str) -> str:
    """`rlvr train --help` / `rlvr eval --help`: what the command does, the config groups with their
    options (rlvr's, not Hydra's internal schema entries) and where the reference of every key is."""
    from rlvr.config_docs import GROUP_LINES, defaults_list, options

    chosen = defaults_list()
    lines = [f"usage: rlvr {command} [+experiment=NAME] [GROUP=OPTION ...] [GROUP.KEY=VALUE ...] [-m]", "",
             WHAT[command], "", "config groups (pick an option with GROUP=OPTION; the default is marked *):"]
    for group, line in {**GROUP_LINES, "tools": "Tools the model may call in multi-turn rollouts."}.items():
        names = ", ".join(o + ("*" if o == chosen.get(group) else "") for o in options(group))
        lines += [f"  {group:<11}{line}", f"  {'':<11}options: {names}"]
    lines += [f"  {'experiment':<11}Whole setups, applied with +experiment=NAME: {', '.join(options('experiment'))}",
              "", "every key, its type, default, choices and meaning: docs/reference.md",
              f"the composed config, nothing run:                 rlvr {command} [overrides] --cfg job",
              f"Hydra's own flags:                                 rlvr {command} --hydra-help"]
    return "\n".join(lines)


def _reported(run, cfg: DictConfig) -> float | None:
    """Run `run(config, run_dir)` on the typed config (rlvr.config.typed: the one conversion); a user's
    error (RlvrError) is printed alone, without a traceback, and the run dir Hydra made for the
    rejected run is removed if nothing else was written there."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        unknown_keys(cfg)
        return run(typed(cfg), run_dir).get("eval/accuracy")
    except RlvrError as e:
        logging.getLogger("rlvr").error("%s", e)
        remove_if_untouched(run_dir)
        sys.exit(1)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _train(cfg: DictConfig) -> float | None:
    from rlvr import launch  # heavy imports (torch, transformers) after the config composed
    from rlvr.recipe import train

    # in this process, across the ranks launch.nproc_per_node asks for, or as one rank under torchrun
    return _reported(lambda cfg, run_dir: launch.run(train, cfg, run_dir, discard=remove_if_untouched), cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _sft(cfg: DictConfig) -> float | None:
    from rlvr import launch
    from rlvr.sft import run_sft

    return _reported(lambda cfg, run_dir: launch.run(run_sft, cfg, run_dir, discard=remove_if_untouched), cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _eval(cfg: DictConfig) -> float | None:
    from rlvr.evaluate import run_eval

    return _reported(run_eval, cfg)


def _plot() -> None:
    from rlvr.plot import main as plot_main

    sys.exit(plot_main(sys.argv[1:]))


def last_stage(args: list[str]) -> str:
    """The stage a `rlvr train` command line ends with: its `recipe=[...]`'s last, else RL (a recipe set
    in a YAML file instead is checked once the config composed)."""
    recipe = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("recipe=")]
    stages = recipe[-1].strip("[]").split(",") if recipe else ["rl"]
    return stages[-1].strip() or "rl"


def _user_config_dirs(args: list[str]) -> list[Path]:
    """The folders of `--config-dir DIR` / `--config-dir=DIR` (`-cd`): Hydra looks for options there too."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(Path(args[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


COMMANDS = {"train": _train, "sft": _sft, "eval": _eval, "plot": _plot}
CONFIGURED = ("train", "sft", "eval")  # the commands that compose a config


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"rlvr: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    if command in CONFIGURED and {"-h", "--help"} & set(rest):
        print(command_help(command))
        sys.exit(0)
    if command in CONFIGURED:
        try:
            check_overrides(rest, Path(CONFIG_DIR), _user_config_dirs(rest))
            if command in ("train", "sft"):
                refuse_early(rest, "sft" if command == "sft" else last_stage(rest))
        except (ConfigError, RunDirError) as e:
            print(f"rlvr {command}: {e}", file=sys.stderr)
            sys.exit(1)
        register()
        # hydra.utils logs the error of a `_target_` that does not import, then raises it; rlvr reports
        # the raised error with the config key that named it, so Hydra's own line would say it twice.
        logging.getLogger("hydra.utils").setLevel(logging.CRITICAL)
    sys.argv = [f"rlvr {command}", *rest]
    COMMANDS[command]()


if __name__ == "__main__":
    main()
