"""The CUDA path (marked `gpu`: skipped without an NVIDIA GPU; CI never has one). On a GPU machine
without vLLM, `bash scripts/gpu_check.sh` runs the full table; this runs its smallest case, and
checks that the learner's bf16 attention does not use cuDNN's kernel (rlvr.modeling.kernels.SDPA_BACKENDS)."""

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


def test_the_learners_forwards_leave_cudnn_attention_out(cache_dir, tiny_path):
    """cuDNN's attention builds a graph for each new shape (0.7 s a width on an H200, rlvr.modeling.kernels.SDPA_BACKENDS);
    a bf16 attention with a mask under the learner's forward context must run another kernel."""
    from torch.profiler import profile

    from rlvr.learner import Learner
    from rlvr.learner.precision import resolve

    from .conftest import compose_config

    cfg = compose_config(["model=tiny", "learner.precision=bf16-mixed"], cache_dir)
    learner = Learner(tiny_path, cfg.optim, cfg.algorithm, cfg.learner, 1.0, 8, "cuda",
                      resolve("bf16-mixed", "auto", None, "cuda"))
    q = torch.randn(2, 4, 40, 64, device="cuda", requires_grad=True)
    mask = torch.ones(40, 40, dtype=torch.bool, device="cuda").tril()[None, None]
    with profile() as prof:
        with learner.scorer.forward_context():
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        out.float().sum().backward()
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_efficient_attention" in names, sorted(n for n in names if "attention" in n)
    assert not any("cudnn_attention" in n for n in names)
