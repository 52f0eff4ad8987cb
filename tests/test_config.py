"""Every config composes and every `_target_` loads; bad keys and values fail at start, named."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import get_method

from rlvr.cli import CONFIG_DIR
from rlvr.config import check, register, typed
from rlvr.data import build_task
from rlvr.errors import ConfigError
from rlvr.keys import check_overrides, group_options, unknown_keys
from rlvr.rewards import Rewards, build_rewards
from rlvr.rollout.engine import EngineConfigError, check_backend

from .conftest import cli_here, compose_config, compose_dictconfig
from .test_files import ROWS, SUFFIX, write

GROUPS = ["model", "data", "reward", "algorithm", "rollout", "optim", "trainer", "learner", "launch", "logger", "eval"]


def _options(group: str) -> list[str]:
    return group_options(group, [Path(CONFIG_DIR)])


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS + ["experiment"] for o in _options(g)])
def test_every_option_composes_and_passes_the_checks(group, option, tmp_path):
    override = f"+experiment={option}" if group == "experiment" else f"{group}={option}"
    extra = ["model.path=/some/model"] if option == "local" else []
    if group == "data" and option in SUFFIX:  # a dataset option needs a dataset
        path = write(tmp_path / f"data{SUFFIX[option]}", ROWS, option)
        extra = [f"data.path={path}", "data.prompt_key=question", "data.eval_size=2"]
    cfg = compose_config([override, *extra])
    if option == "mixture" and group == "data":  # (its sources come from an experiment: +experiment=mixture)
        with pytest.raises(ConfigError, match="data.sources: a mixture needs at least one source"):
            check(cfg)
        return
    check(cfg)
    task = build_task(cfg)
    assert task.sample(2) and task.eval_prompts()
    build_rewards(cfg).close()
    if cfg.model.build is not None:
        assert callable(get_method(cfg.model.build))


def test_overrides_from_the_contract_apply():
    cfg = compose_config(["+experiment=multiplication", "model=tiny", "trainer.max_steps=3", "optim.lr=1e-5",
                          "algorithm.group_size=4", "data.batch_size=2", "seed=7"])
    assert (cfg.trainer.max_steps, cfg.optim.lr, cfg.algorithm.group_size, cfg.data.batch_size, cfg.seed) == \
        (3, 1e-5, 4, 2, 7)
    assert cfg.model.path.endswith("models/tiny")


def test_make_train_runs_dapo_unless_told_otherwise():
    """`make train`'s experiment runs DAPO (docs/results.md; the suite pins GRPO), and an
    algorithm on the command line replaces it."""
    assert compose_config(["+experiment=multiplication", "algorithm=dapo"]).algorithm.dynamic_sampling.enabled
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):  # unpinned: as `make train` composes
        unpinned = compose(config_name="train", overrides=["+experiment=multiplication"]).algorithm
    assert unpinned.name == "dapo" and unpinned.clip_eps_high == 0.28
    assert compose_config(["+experiment=multiplication", "algorithm=grpo"]).algorithm.name == "grpo"


@pytest.mark.parametrize("override, key", [
    ("algorithm.group_size=1", "algorithm.group_size"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("reward.correct_term=nope", "reward.correct_term"),
    # combinations that make no sense
    ("algorithm=gspo algorithm.loss_agg=token_mean", "sequence-level ratio"),
    ("algorithm.kl.coef=0.1 algorithm.kl.reward_coef=0.1", "KL in both the loss"),
    ("algorithm=dr_grpo algorithm.advantage=grpo", "Dr. GRPO removes the std normalisation"),
    ("algorithm=dapo algorithm.overlong.buffer=64", "algorithm.overlong.buffer"),
    ("algorithm.dual_clip=0.5", "algorithm.dual_clip"),
    ("algorithm.tis_cap=0.5", "algorithm.tis_cap"),
    # the correctness audit: each of these trains on something other than what it says
    ("algorithm.kl.coef=0.1 algorithm.kl.estimator=k1", "algorithm.kl.estimator: k1 in the loss"),
    ("rollout.top_p=0.9", "rollout.top_p: must be 1.0 in training"),
    ("trainer.max_steps=0", "trainer.max_steps: must be >= 1"),
    # a bad value is named by its own key, not by another check that happens to trip over it
    ("data.batch_size=0", "data.batch_size: must be >= 1"),
    ("sft.plateau_patience=-1", "sft.plateau_patience: must be >= 0"),
    ("sft.plateau_gain=-0.1", "sft.plateau_gain: must be >= 0"),
    ("sft.save_every=-1", "sft.save_every: must be >= 0"),
    ("dpo.eval_every=-1", "dpo.eval_every: must be >= 0"),
    ("dpo.lr=0", "dpo.lr: must be > 0"),
    ("trainer.keep_last=-1", "trainer.keep_last: must be >= 0"),
    # the plateau is watched at the evaluations: without them it would never be reached
    ("sft.plateau_patience=2 sft.eval_every=0", "sft.plateau_patience: the plateau is watched at the evaluations"),
])
def test_nonsense_values_are_rejected_with_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        check(compose_config(override.split()))


@pytest.mark.parametrize("override, expected", [
    ("algorithm.loss_agg=token_avg", "algorithm.loss_agg: must be one of token_mean, seq_mean_token_mean, "
                                     "token_sum_norm, got 'token_avg'"),
    ("learner.precision=fp16-mixed", "learner.precision: must be one of auto, fp32, bf16-mixed, got 'fp16-mixed' "
                                     "(fp16 is refused"),
    ("learner.precision=bf16", "learner.precision: must be one of auto, fp32, bf16-mixed, got 'bf16'"),
    ("rollout.dtype=float16", "rollout.dtype: must be one of auto, float32, bfloat16"),
    ("rollout.backend=sglang", "rollout.backend: must be one of vllm, transformers"),
    ("launch.device=tpu", "launch.device: must be one of auto, cpu, cuda, mps"),
    ("algorithm.advantage=grpo,rlooo", "algorithm.advantage: must be one of grpo, dr_grpo, rloo, got 'rlooo'"),
    # a misspelt key, before Hydra's advice to add it with `+`
    ("trainer.max_stepz=2", "trainer.max_stepz: no such key; trainer takes max_steps, eval_every, save_model, "
                            "log_samples, samples_every, save_every, keep_last, resume, overwrite, max_bad_steps; "
                            "did you mean trainer.max_steps?"),
    ("optimm.lr=1", "optimm: no such key; the config takes model, data"),
    # a group option that does not exist: the options there are, none of rlvr's internal schemas
    ("algorithm=grpoo", "algorithm=grpoo: no such option; algorithm is one of dapo, dr_grpo, grpo, gspo, rloo; "
                        "did you mean algorithm=grpo?"),
    ("+experiment=multiplicaton", "experiment=multiplicaton: no such option; experiment is one of bfcl, function_picking, mixture, "
                                  "multiplication, multiplication_4x2, multiplication_4x2_sft, multiplication_tool, "
                                  "multiplication_tool_sft; did you mean experiment=multiplication?"),
    # keys that moved when trainer was split by concern
    ("trainer.precision=fp32", "trainer.precision: renamed to learner.precision"),
    ("trainer.nproc_per_node=2", "trainer.nproc_per_node: renamed to launch.nproc_per_node"),
])
def test_command_line_keys_and_choices_are_checked_before_hydra(override, expected):
    with pytest.raises(ConfigError) as e:
        check_overrides([override], Path(CONFIG_DIR), [])
    assert expected in str(e.value)
    assert "schema" not in str(e.value)


@pytest.mark.parametrize("override", ["learner.precision=bf16-mixed", "data.levels=[[1,1]]", "+reward.terms.x._target_=a.b",
                                      "tools=[calculator,python]", "algorithm=grpo,dapo", "hydra.run.dir=x",
                                      "hydra/launcher=basic", "rollout.dtype=${oc.env:X}", "seed=0,1,2", "model=local",
                                      "--config-dir=x", "-m", "trainer.resume=auto", "algorithm=choice(grpo,dapo)",
                                      "seed=range(0,3)"])
def test_command_line_check_lets_valid_overrides_through(override):
    check_overrides([override], Path(CONFIG_DIR), [])


def test_the_schema_rejects_a_choice_that_does_not_exist_too():
    """A YAML file (an experiment, a user's config dir) is not seen by the command-line check: the schema's
    choices reject it when Hydra composes, naming the key."""
    with pytest.raises(Exception, match="algorithm.loss_agg=token_avg") as e:
        compose_config(["algorithm.loss_agg=token_avg"])
    assert "Invalid value 'token_avg', expected one of [token_mean, seq_mean_token_mean, token_sum_norm]" in \
        str(e.value.__cause__)


@pytest.mark.parametrize("override", ["rollout.top_p=0.9"])
def test_eval_may_sample_with_top_p(override):
    check(compose_config(override.split()), training=False)


@pytest.mark.parametrize("override, expected", [
    ("optim.lrr=1e-5", "optim.lrr: no such key; optim takes lr, weight_decay"),   # misspelt key
    ("optim.lr=fast", "Value 'fast' of type 'str' could not be converted"),  # wrong type
    ("data.levelz=[[1,1]]", "Key 'levelz' not in 'MultiplicationDataConfig'"),
    ("algorithm.group_size=1", "algorithm.group_size: must be >= 2"),        # checked before any model loads
    # Hydra's own hint for the misspelt key above: the `+` adds it, and the schema must still refuse it
    ("+optim.lrr=1e-5", "optim.lrr: no such key; optim (OptimConfig) takes lr, weight_decay, betas, "
                        "max_grad_norm, warmup_steps; did you mean optim.lr?"),
])
def test_cli_fails_at_start_naming_the_key(override, expected, tmp_path):
    # model.path points nowhere: reaching model loading would fail differently, so the message proves
    # the check ran first.
    result = cli_here(["train", override, "model=local", f"model.path={tmp_path}/absent",
                      f"hydra.run.dir={tmp_path}/run"], cache=tmp_path)
    assert result.returncode == 1
    assert expected in result.stderr + result.stdout
    assert not (tmp_path / "run").exists()  # a rejected run leaves no run dir


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has Apple's MPS")


@pytest.mark.parametrize("override, expected", [
    pytest.param("launch.device=cuda", "launch.device=cuda, but torch sees no GPU", marks=NO_CUDA),
    pytest.param("launch.device=mps", "launch.device=mps, but this machine has no Apple-silicon GPU", marks=NO_MPS),
])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_device_that_is_not_there_is_named_before_a_model_loads(command, override, expected, tmp_path):
    result = cli_here([command, override, "model=local", f"model.path={tmp_path}/absent",
                      f"hydra.run.dir={tmp_path}/run"], cache=tmp_path)
    assert result.returncode == 1
    assert expected in result.stderr and "use launch.device=cpu or auto" in result.stderr
    assert len([line for line in result.stderr.splitlines() if "Error" in line or "error" in line]) <= 1


def test_vllm_missing_names_the_other_backend(monkeypatch):
    # vLLM is installed here; its absence (a Mac, a node without it) is a fault this machine cannot cause
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(EngineConfigError, match="vLLM is not installed.*rollout.backend=transformers"):
        check_backend("vllm", "cpu")
    check_backend("transformers", "cpu")
    with pytest.raises(EngineConfigError, match="rollout.backend=transformers"):
        monkeypatch.setattr(importlib.util, "find_spec", real)
        check_backend("vllm", "mps")


@pytest.mark.parametrize("override, expected", [
    ("+optim.lrr=1e-5", "optim.lrr: no such key; optim (OptimConfig) takes lr,"),
    ("+seeds=1", "seeds: no such key; the config (TrainConfig) takes model, data,"),
    ("+algorithm.kl.coeff=0.1", "algorithm.kl.coeff: no such key; algorithm.kl (KLConfig) takes coef, "
                                "reward_coef, estimator; did you mean algorithm.kl.coef?"),
    ("+reward.terms.correct.wieght=2", "reward.terms.correct.wieght: no such key; reward.terms.correct "
                                       "(RewardTerm) takes _target_, weight, kwargs"),
    ("+data.levelz=[[1,1]]", "data.levelz: no such key; data (MultiplicationDataConfig) takes"),
    ("data=jsonl data.path=x.jsonl +data.prompt_keys=q", "data.prompt_keys: no such key; data (FileDataConfig)"),
])
def test_a_key_added_with_plus_that_no_schema_takes_is_named(override, expected):
    cfg = compose_dictconfig(override.split())
    with pytest.raises(ConfigError, match=re.escape(expected)) as raised:
        unknown_keys(cfg)
    assert "+" not in str(raised.value)  # never the advice that let the key in


def test_a_reward_term_can_be_added_from_the_command_line():
    overrides = ["+reward.terms.short._target_=rlvr.rewards.text.length_penalty", "+reward.terms.short.weight=0.1",
                 "+reward.terms.short.kwargs.limit=40"]
    unknown_keys(compose_dictconfig(overrides))
    cfg = compose_config(overrides)
    check(cfg)
    rewards = Rewards(cfg.reward)
    assert rewards.weights == {"correct": 1.0, "format": 0.2, "short": 0.1}
    assert rewards.fns["short"]("x" * 60, None) == -0.5  # limit 40, span 40: 20 over is half the penalty


@pytest.mark.parametrize("override, expected", [
    ("+reward.terms.short.weight=0.1", "reward.terms.short._target_: is missing"),
    ("reward.terms.correct.weight=abc", "reward.terms.correct.weight: must be a number, got 'abc'"),
    ("reward.terms.correct.kwargs=3", "reward.terms.correct.kwargs: must be a mapping"),
])
def test_a_bad_reward_term_is_named(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        check(compose_config([override]))


def test_untyped_nodes_take_any_key():
    cfg = compose_dictconfig(["+reward.terms.correct.kwargs.anything=1"])  # the reward function's own keywords
    cfg.data = {"_target_": "my_pkg.Task", "words": ["a"], "batch_size": 2}
    unknown_keys(cfg)  # a user's task without a schema
    assert typed(cfg).data.options == {"words": ["a"]}
    unknown_keys(compose_dictconfig(["+experiment=function_picking"]))


def _run_in(cwd: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`rlvr <args>` started in `cwd`, where its default run dir (outputs/<date>/<time>) lands."""
    return cli_here(args, cwd / "cache", cwd=cwd)


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_rejected_run_leaves_no_run_dir_but_never_removes_a_run(tmp_path, command):
    bad = [command, "+optim.lrr=1e-5", "model=local", f"model.path={tmp_path}/absent"]
    (tmp_path / "mine.txt").write_text("not rlvr's")
    result = _run_in(tmp_path, bad)
    assert result.returncode == 1 and "optim.lrr: no such key" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # outputs/<date>/<time> all gone

    # A run dir that holds a run (metrics, a checkpoint) keeps all of it when a resume is rejected.
    run_dir = tmp_path / "outputs" / "old"
    (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    result = _run_in(tmp_path, [*bad, "trainer.resume=auto", "hydra.run.dir=outputs/old"])
    assert result.returncode == 1 and "optim.lrr: no such key" in result.stderr
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert (run_dir / "checkpoints" / "step-000002").is_dir() and (run_dir / ".hydra").is_dir()


def test_a_reward_that_does_not_import_is_reported_once(tmp_path):
    result = cli_here(["train", "reward.terms.correct._target_=rlvr.rewards.nope.missing", "model=local",
                      f"model.path={tmp_path}/absent", f"hydra.run.dir={tmp_path}/run"], cache=tmp_path)
    assert result.returncode == 1
    assert "reward.terms.correct._target_='rlvr.rewards.nope.missing' cannot be imported" in result.stderr
    assert result.stderr.count("[ERROR]") == 1, result.stderr  # one error, one log record
    assert "Traceback" not in result.stderr


def test_a_reward_package_that_is_not_importable_gets_one_line_with_the_fix(tmp_path):
    """The README's own reward, run from a folder where `my_pkg` is neither installed nor on PYTHONPATH:
    one line that names the missing package and both fixes (Hydra's own text ran over three lines and
    ended in a question)."""
    result = cli_here(["train", "reward=exact", "+reward.terms.loud._target_=my_pkg.rewards.shouting",
                       "+reward.terms.loud.weight=0.1", "model=local", f"model.path={tmp_path}/absent",
                       f"hydra.run.dir={tmp_path}/run"], cache=tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert "reward.terms.loud._target_='my_pkg.rewards.shouting' cannot be imported: no module named 'my_pkg'" \
        in errors[0]
    assert "pip install -e" in errors[0] and "PYTHONPATH=." in errors[0] and "Are you sure" not in errors[0]


@pytest.mark.parametrize("group", ["local", "smollm2"])  # smollm2 builds its folder, but only in the cache
def test_missing_model_folder_is_named(tmp_path, group):
    result = cli_here(["train", f"model={group}", f"model.path={tmp_path}/absent", f"hydra.run.dir={tmp_path}/run"],
                     cache=tmp_path / "cache")
    assert result.returncode != 0
    assert f"model.path='{tmp_path}/absent' does not exist" in result.stderr + result.stdout
    assert not (tmp_path / "absent").exists()


def test_help_lists_the_commands():
    result = cli_here(["--help"], cache=Path("/nonexistent"))
    assert result.returncode == 0 and "rlvr train" in result.stdout


def _folder_like_tiny(tiny_path: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(tiny_path, dest)
    return dest


def test_a_model_that_is_not_a_causal_lm_is_named(tmp_path, cache_dir, tiny_path):
    from transformers import DistilBertConfig, DistilBertModel

    folder = _folder_like_tiny(tiny_path, tmp_path / "encoder")
    for f in folder.glob("*.safetensors"):
        f.unlink()
    DistilBertModel(DistilBertConfig(vocab_size=512, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(folder)
    result = cli_here(["train", "model=local", f"model.path={folder}", f"hydra.run.dir={tmp_path}/run"],
                     cache=cache_dir)
    assert result.returncode == 1
    assert (f"model.path='{folder}' (a 'distilbert' model, DistilBertModel) cannot be loaded as a causal LM: this "
            "transformers has none for model_type 'distilbert'") in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_tokenizer_without_chat_template_is_named(tmp_path, cache_dir, tiny_path):
    folder = _folder_like_tiny(tiny_path, tmp_path / "no-template")
    (folder / "chat_template.jinja").unlink()
    result = cli_here(["train", "model=local", f"model.path={folder}", f"hydra.run.dir={tmp_path}/run"],
                     cache=cache_dir)
    assert result.returncode == 1
    assert f"model.path='{folder}' (a 'llama' model, LlamaForCausalLM) has a tokenizer without a chat template" \
        in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_doctests_of_the_config_modules():
    import doctest

    from rlvr import choices, config, errors

    for module in (choices, config, errors):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
