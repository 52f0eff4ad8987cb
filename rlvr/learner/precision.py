"""Which precision the learner computes in and which dtype the engine serves, and why.

Master weights and optimizer state are always float32. `learner.precision`:
- `fp32`: everything in float32.
- `bf16-mixed`: the learner's forward and backward run under bf16 autocast (matmuls in bf16, the
  float32 master weights cast per op); logprobs and the loss are computed in float32 from the logits.
- `auto`: bf16-mixed on CUDA and on CPUs whose flags show `avx512_bf16` or `amx_bf16` (a bf16
  matmul there runs several times faster than float32: docs/precision.md), fp32 elsewhere (without
  those units bf16 is emulated and slower than float32).

The default is auto. In bf16 the canary's tolerance cannot tell one missed sync from the honest
engine/learner difference (see CANARY_TOL); its bit-for-bit check does (rlvr.rollout.engine.Canary).

`rollout.dtype` (`auto`: bfloat16 with bf16-mixed, else float32) is the dtype of the engine's weights:
each sync sends it copies of the master weights in that dtype. fp16 is refused: CPUs have no fast
fp16 matmul, and fp16 training needs loss scaling, which rlvr does not do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.errors import RlvrError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlvr")

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Canary tolerance per engine dtype when rollout.canary_tol is null (scripts/canary_tolerance.py,
# docs/precision.md). float32: between the honest difference (<= 7e-5 on SmolLM2) and one missed sync
# (>= 0.17). bfloat16: kernels that round differently give honest differences that overlap one missed
# sync (0.31-1.5) and reach 3.6 on SmolLM2 (at the canary's third token, whose context is two
# tokens, in a cold start at lr 3e-4), so the tolerance only stops an engine that is grossly off (a
# wrong model, a prefix cache stale for many steps); a missed sync is caught in every dtype by the
# canary's bit-for-bit check (rlvr.rollout.engine.Canary), which needs no tolerance.
CANARY_TOL = {"float32": 1e-3, "bfloat16": 8.0}


def cpu_bf16_flags() -> list[str]:
    """The bf16 units this CPU's flags show (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in BF16_FLAGS if f in flags]


class DeviceError(RlvrError, RuntimeError):
    """The configured device is not there; the message names the key."""


def pick_device(name: str) -> str:
    """The device of `launch.device`: auto is cuda when torch sees a GPU, else mps on Apple
    silicon, else cpu."""
    import torch  # here, not at import: rlvr.config reads this module before anything heavy loads

    mps = torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("launch.device=cuda, but torch sees no GPU (is the CPU build of torch installed?); "
                          f"this machine has {'mps and ' if mps else ''}cpu: use launch.device=cpu or auto")
    if name == "mps" and not mps:
        raise DeviceError("launch.device=mps, but this machine has no Apple-silicon GPU that torch can use; "
                          f"this machine has {'cuda and ' if torch.cuda.is_available() else ''}cpu: "
                          "use launch.device=cpu or auto")
    return name


@dataclass(frozen=True)
class Precision:
    learner: str  # "fp32" | "bf16-mixed"
    engine_dtype: str  # "float32" | "bfloat16"
    canary_tol: float
    why: str

    @property
    def bf16(self) -> bool:
        return self.learner == "bf16-mixed"

    @property
    def engine_torch_dtype(self) -> torch.dtype:
        """The engine's dtype as torch's: what a sync sends."""
        import torch  # (this module is read before any model loads; torch only when a run needs it)

        return getattr(torch, self.engine_dtype)


def resolve(precision: str, engine_dtype: str, canary_tol: float | None, device: str) -> Precision:
    """The precision of a run on `device` from `learner.precision`, `rollout.dtype` and
    `rollout.canary_tol` (null: the measured tolerance of the engine's dtype)."""
    flags = cpu_bf16_flags() if device == "cpu" else []
    if precision == "auto":
        if device == "cuda":
            learner, why = "bf16-mixed", "auto: CUDA"
        elif device == "cpu" and flags:
            learner, why = "bf16-mixed", f"auto: this CPU has {' and '.join(flags)}"
        else:
            learner, why = "fp32", f"auto: this {device.upper()} shows no bf16 unit ({' / '.join(BF16_FLAGS)})"
    else:
        learner, why = precision, f"learner.precision={precision}"
        if precision == "bf16-mixed" and device == "cpu" and not flags:
            log.warning("learner.precision=bf16-mixed on a CPU without %s: bf16 is emulated here and will be "
                        "slower than fp32", " or ".join(BF16_FLAGS))
    dtype = engine_dtype if engine_dtype != "auto" else ("bfloat16" if learner == "bf16-mixed" else "float32")
    tol = canary_tol if canary_tol is not None else CANARY_TOL[dtype]
    return Precision(learner, dtype, tol, why)
