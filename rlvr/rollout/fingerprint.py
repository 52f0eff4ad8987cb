"""Exact fingerprints of weights: what a sync sends, and what the engine holds after it.

A digest is a hash of a tensor's shape and bytes in the engine's dtype, so that two copies agree
exactly when every value does, in any precision. Reading a matrix back from where an engine keeps
it can cost as much as a forward pass of as many tokens as the matrix has columns (vLLM on CPU keeps
linear layers packed for its GEMM), so each sync compares a window of `WIDTH` columns of every
matrix, and of every vector all of it; the window moves on by `WIDTH` each sync. A tensor the sync
left out or a damaged row shows at once; a single damaged entry when the window reaches its column.
"""

from __future__ import annotations

import hashlib

import torch

# Columns of each matrix compared per sync.
WIDTH = 32


def columns(n: int, offset: int) -> torch.Tensor:
    """The window's column indices in a matrix of `n` columns: `WIDTH` of them from `offset` on, wrapping."""
    return torch.arange(offset, offset + min(WIDTH, n)) % n


def window(t: torch.Tensor, offset: int) -> torch.Tensor:
    """What a sync compares of `t`: the window of its columns (a matrix), or all of it."""
    return t[:, columns(t.shape[1], offset).to(t.device)] if t.ndim == 2 else t


def digest(t: torch.Tensor) -> str:
    """A fingerprint of `t`'s shape and values as they are (in the engine's dtype)."""
    h = hashlib.sha256(str(tuple(t.shape)).encode())
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()
