"""How the training process uses its host's memory allocator."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse in this process; True if it could (Linux, glibc).

    By default it maps each block of more than 128 KB-32 MB on its own and unmaps it on free, and
    trims the heap's free top: every step of the learner then allocates its big tensors (logits, the
    embedding's gradient, bf16 copies of the weights) in pages the kernel must fault in afresh, a large
    share of a bf16-mixed update on a small CPU (docs/speed.md). With no
    block mapped on its own and no trim, the next step reuses the same pages (0 faults by the third
    step). The cost: resident memory stays at its peak instead of shrinking between steps, and a freed
    block can stay a hole that a slightly bigger aligned request does not fit. The peak creeps up over
    a run either way; this adds a little to it (docs/speed.md)."""
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl)
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
