"""The CUDA path (marked `gpu`: skipped without an NVIDIA GPU; CI never has one). On a GPU machine
without vLLM, `bash scripts/gpu_check.sh` runs the full table; this runs its smallest cases."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from .conftest import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU")]


def test_train_on_cuda_with_the_transformers_backend_in_bf16():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cases", "tiny-bf16",
                             "--steps", "2"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| tiny |"))
    assert "bf16-mixed" in row
