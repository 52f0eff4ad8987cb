"""A Python tool: the model's code runs in a separate process, limited and cut off.

Each call gets a new interpreter (`python -I`: no user site, no PYTHON* variables) with an empty
environment, a fresh scratch folder as its working directory (deleted afterwards), no stdin, and
resource limits: CPU seconds, address space, size of any file it writes, open files. Where the
kernel lets an unprivileged process (Linux user namespaces), it first moves into a network
namespace of its own, which has no interfaces up: no network at all. Elsewhere `socket` is
replaced in Python, which keeps honest code off the network but not code that loads `_socket` or
a C library. The call is killed at its wall-clock limit.

What this does not protect against (docs/tools.md): it runs as the training user, so it can read
every file that user can (the model, your data, ~/.ssh) and write outside the scratch folder within
the file-size limit; it shares the machine's CPUs, kernel and /tmp. For untrusted code, run the
trainer in a container or VM with nothing of value mounted.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Run by the child before the model's code: limits, then no network, then the code itself.
_LAUNCHER = r"""
import ctypes, resource, sys
cpu, memory, fsize = (int(x) for x in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu s, SIGKILL a second later
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
try:  # CLONE_NEWUSER | CLONE_NEWNET: a network namespace of our own, with no interface up
    isolated = ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000) == 0
except Exception:
    isolated = False
if not isolated:
    import socket
    def _no_network(*args, **kwargs):
        raise OSError("network access is disabled in the python tool")
    socket.socket = socket.create_connection = socket.socket.connect = _no_network
del ctypes, resource, sys, cpu, memory, fsize, isolated
__name__ = "__main__"
exec(compile(open("main.py").read(), "main.py", "exec"))
"""


def python(code: str, timeout_s: float = 5.0, memory_mb: int = 512, max_file_mb: int = 1) -> str:
    """Run `code` in a sandboxed interpreter and return what it printed (stdout, then stderr).
    Raises RuntimeError (the error message goes to the model) when it fails or runs out of time."""
    with tempfile.TemporaryDirectory(prefix="rlvr-python-") as scratch:
        Path(scratch, "main.py").write_text(code)
        cpu_s = max(1, int(timeout_s))
        args = [sys.executable, "-I", "-c", _LAUNCHER, str(cpu_s), str(memory_mb * 2**20), str(max_file_mb * 2**20)]
        try:
            done = subprocess.run(args, cwd=scratch, env={}, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s, text=True, errors="replace")
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the code ran past {timeout_s:g} s and was killed") from None
    out = done.stdout + done.stderr
    if done.returncode != 0:
        # A busy loop reaches the CPU limit about when the wall-clock limit falls: whichever comes first,
        # the message says the code ran out of time (SIGXCPU is sent only at the CPU limit)
        if done.returncode == -signal.SIGXCPU:
            reason = f"the code ran past {cpu_s} s of CPU time and was killed"
        else:
            reason = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
        raise RuntimeError(f"{reason}: {out[-2000:]}")
    return out
