"""The allocator setting of the training process, read back from glibc in a real process of its own."""

from __future__ import annotations

import subprocess
import sys

MALLINFO = """
import ctypes, sys, torch
from rlvr.host import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
x = torch.ones(50_000_000)  # 200 MB
mapped = libc.mallinfo2().hblkhd  # bytes in blocks mapped on their own
del x
print(kept, mapped, libc.mallinfo2().fordblks)  # fordblks: free bytes kept in the heap
"""


def test_big_tensors_stay_in_the_heap_after_keep_freed_memory():
    """By default glibc maps a 200 MB block on its own and unmaps it on free (the next one faults in
    its pages afresh); after `keep_freed_memory` it comes from the heap, and stays there once freed."""
    out = {mode: subprocess.run([sys.executable, "-c", MALLINFO, mode], capture_output=True, text=True, check=True)
           .stdout.split() for mode in ("keep", "default")}
    assert out["keep"][0] == "True"
    assert int(out["default"][1]) >= 200_000_000 and int(out["default"][2]) < 200_000_000
    assert int(out["keep"][1]) < 200_000_000 and int(out["keep"][2]) >= 200_000_000
