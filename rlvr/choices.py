"""The config values that are one of a fixed set of words (`learner.precision`, `algorithm.advantage`...):
each a `Choice`, so that a word that is not one of them fails when Hydra composes the config, naming
the key and the words it takes.

>>> Precision("bf16-mixed") == "bf16-mixed", f"{Precision('fp32')}"
(True, 'fp32')
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A config value that is one of a fixed set of words; equal to its word, and printed as it."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def choice(name: str, *values: str) -> type[Choice]:
    """The Choice type `name`, whose values are `values`."""
    return Choice(name, {v: v for v in values}, module=__name__)  # (names like bf16-mixed need the functional API)


Precision = choice("Precision", "auto", "fp32", "bf16-mixed")
EngineDtype = choice("EngineDtype", "auto", "float32", "bfloat16")
Device = choice("Device", "auto", "cpu", "cuda", "mps")
Backend = choice("Backend", "vllm", "transformers")
Advantage = choice("Advantage", "grpo", "dr_grpo", "rloo")
LossAgg = choice("LossAgg", "token_mean", "seq_mean_token_mean", "token_sum_norm")
Ratio = choice("Ratio", "token", "sequence")
KLEstimator = choice("KLEstimator", "k1", "k2", "k3")
Overlong = choice("Overlong", "none", "mask", "soft")
Combine = choice("Combine", "sum_then_normalise", "normalise_then_sum")
WandbMode = choice("WandbMode", "online", "offline", "disabled")
PreferenceLoss = choice("PreferenceLoss", "dpo", "simpo")
Sampling = choice("Sampling", "uniform", "difficulty")
