"""How the learner's forward computes on its device: which attention kernel runs it, and whether its
decoder layers run compiled (`learner.compile`). Choices measured per device; the learner
(rlvr.learner) and the transformers engine (rlvr.rollout.hf_engine) apply them."""

from __future__ import annotations

import contextlib
import shutil

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlvr import distributed
from rlvr.models import ModelError

# SDPA's kernels on CUDA, cuDNN's left out. torch picks cuDNN's attention first for a bf16 forward with a
# mask, and it builds a graph for each new shape, at a cost far above the forward's own. The learner's
# widths change with every micro-batch, so it paid that at nearly every one (measured with
# scripts/gpu_check.py: docs/backends.md, The CUDA path). Flash and memory-efficient attention take any
# shape at no set-up cost. The transformers
# engine (rlvr.rollout.hf_engine), whose prompt widths change with every call, leaves it out too.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: str) -> contextlib.AbstractContextManager:
    """The SDPA kernels a forward on `device` may use: on CUDA `SDPA_BACKENDS`, elsewhere torch's choice."""
    return sdpa_kernel(SDPA_BACKENDS) if torch.device(device).type == "cuda" else contextlib.nullcontext()

# On CPU, eager attention while the attention weights it keeps for the backward stay this small
# (elements of [rows, heads, width, width] per layer), SDPA beyond (`attention_kernel`).
EAGER_MAX_ELEMENTS = 2**21


def attention_kernel(device: str, rows: int, width: int, heads: int) -> str:
    """The attention implementation for a forward of `rows` rows (sequences, or packed lanes) of `width`
    tokens. SDPA's CPU flash kernel has a fixed cost a call in its backward whatever the size, which
    dominates small forwards, where eager attention makes a whole update faster. Eager keeps the [rows,
    heads, width, width] attention weights for the backward, so it is only taken while they are small;
    SDPA's memory grows linearly with the width, and on long packed lanes it was as fast and took less
    memory (docs/speed.md). On GPUs: SDPA."""
    if torch.device(device).type == "cpu" and rows * heads * width * width <= EAGER_MAX_ELEMENTS:
        return "eager"
    return "sdpa"


def compile_choice(setting: str | bool, bf16: bool, device: str) -> tuple[bool, str]:
    """Whether the learner compiles its decoder layers with torch.compile (`learner.compile`), and why.

    Under bf16-mixed on a CPU, compiled layers are faster: autocast's casts, the norms and the activation
    fuse into few passes, where eager runs each as a pass over the activations of its own. In fp32 the
    matrix products dominate and it gained nothing (docs/speed.md). The first step pays for compiling
    (less with torch's compile cache, /tmp/torchinductor_<user>, warm), once more the first time a run
    takes the other attention kernel (`attention_kernel`). Not measured on GPUs nor across processes."""
    if setting is True or setting is False:
        return setting, "as configured"
    if not bf16:
        return False, "fp32, where compiling gained nothing"
    if torch.device(device).type != "cpu":
        return False, f"not measured on {device}"
    if distributed.world_size() > 1:
        return False, "not tested across processes"
    if shutil.which("g++") is None:
        return False, "no C++ compiler (g++) for torch.compile's CPU code"
    return True, "bf16-mixed on the CPU, where it fuses the casts and elementwise passes (docs/speed.md)"


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers (the classes transformers keeps whole when it splits a model), also
    inside peft's wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kinds = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in kinds]


def compile_layers(model: torch.nn.Module) -> None:
    """torch.compile each decoder layer of `model` in place (the weights keep their names, for checkpoints
    and syncs), with dynamic shapes: every width and every layer share a graph. A run compiles a few,
    one per grad mode, attention mask dtype (eager or SDPA) and one row or more: 5 in `make train` before
    the bf16 canary's second reference (a forward without autocast) added one, under torch's
    recompile_limit of 8 (past it the layer runs eager, with a warning)."""
    if distributed.world_size() > 1:
        raise ModelError("learner.compile=true is not supported across processes yet: use one process, "
                         "or learner.compile=auto")
    if shutil.which("g++") is None:
        raise ModelError("learner.compile=true needs a C++ compiler (g++) for torch.compile's CPU code, and "
                         "there is none on PATH: install g++, or use learner.compile=auto or false")
    layers = decoder_layers(model)
    if not layers:
        raise ModelError(f"learner.compile=true: {type(model).__name__} names no decoder layers "
                         "(_no_split_modules) to compile; use learner.compile=false")
    for layer in layers:
        layer.compile(dynamic=True)
