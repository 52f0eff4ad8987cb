"""Launching rlvr across processes: `rlvr train ... launch.nproc_per_node=N` starts a worker group of
N ranks through torch's elastic launcher (the API behind torchrun); running the CLI under `torchrun`
yourself works too (`run` joins the group torchrun made). What each rank then does: rlvr.distributed.

Failures: a rank that raises exits at once with code 1, after logging why; one that dies or hangs
(a collective waits at most launch.dist_timeout_s) does too, so the launcher sees a failed rank,
stops the others and reports which rank failed and the last complete checkpoint. Ctrl-C (or SIGTERM,
e.g. a scheduler's time limit) reaches the launcher alone (each rank has a process group of its own),
which passes it on to every rank and goes on watching them: each finishes its step, rank 0 writes a
checkpoint, and all exit, however long the step takes (each collective waits at most
launch.dist_timeout_s). A second Ctrl-C stops the ranks at once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from rlvr import models
from rlvr.checkpoint import complete_checkpoints
from rlvr.config import TrainConfig, check
from rlvr.distributed import on_rank0, rank, timed_out
from rlvr.errors import RlvrError
from rlvr.rundir import GracefulStop
from rlvr.runlog import Harmless

log = logging.getLogger("rlvr")


class DistributedError(RlvrError, RuntimeError):
    """A rank failed or was stopped; the message names the rank and what is left on disk."""


# A rank's exit code when a collective gave up waiting for the others (timeout(1)'s code).
TIMED_OUT = 124


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn: Callable[[TrainConfig, Path], dict], cfg: TrainConfig, run_dir: Path,
        discard: Callable[[Path], None] = lambda _: None) -> dict:
    """`fn(cfg, run_dir)` (rlvr.train.train) in this process, or across the ranks `cfg.launch` asks for.

    Under torchrun (its environment, no process group yet) this process is one rank: it joins the
    group, takes rank 0's run dir (each rank's Hydra may have made its own; `discard` removes this
    rank's if nothing was written there) and runs. With launch.nproc_per_node * nnodes > 1 it
    launches the worker group and waits for it (`launch`). Otherwise it simply runs `fn`.
    """
    if "LOCAL_RANK" in os.environ and not dist.is_initialized():
        _join(cfg)
        agreed = Path(on_rank0(lambda: str(run_dir)))
        if agreed.resolve() != run_dir.resolve():
            discard(run_dir)
        return _run_rank(fn, cfg, agreed)
    if cfg.launch.nproc_per_node * cfg.launch.nnodes > 1:
        check(cfg)  # a config that cannot work fails here, once, rather than on every rank
        models.resolve(cfg.model, Path(cfg.cache_dir))  # a model to build is built once, on each node
        return launch(fn, cfg, run_dir)
    return fn(cfg, run_dir)


def launch(fn: Callable[[TrainConfig, Path], dict], cfg: TrainConfig, run_dir: Path) -> dict:
    """Run `fn` on launch.nproc_per_node ranks on this machine (launch.nnodes machines in all) with
    torch's elastic launcher, and wait for them. Every rank gets this typed config, resolved once at
    the entry (so `${now:...}` names one run dir). One rank that fails or dies stops the group;
    the error names it and the last complete checkpoint. Returns the final evaluation (summary.json)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    t = cfg.launch
    endpoint = t.rdzv_endpoint or f"127.0.0.1:{_free_port()}"
    config = LaunchConfig(min_nodes=t.nnodes, max_nodes=t.nnodes, nproc_per_node=t.nproc_per_node,
                          run_id=f"rlvr-{secrets.token_hex(4)}", rdzv_backend="static", rdzv_endpoint=endpoint,
                          rdzv_configs={"rank": t.node_rank, "timeout": int(t.dist_timeout_s)}, max_restarts=0,
                          monitor_interval=0.5, start_method="spawn",
                          signals_to_handle="SIGHUP,SIGQUIT")  # SIGINT and SIGTERM: _PassSignalsOn
    log_file = next((h.baseFilename for h in logging.root.handlers if isinstance(h, logging.FileHandler)), None)
    log.info("launching %d ranks (%d per node, %d nodes; this is node %d, rendezvous at %s)",
             t.nproc_per_node * t.nnodes, t.nproc_per_node, t.nnodes, t.node_rank, endpoint)
    stop = _PassSignalsOn()
    try:
        elastic_launch(config, _worker)(fn, cfg, str(run_dir), log_file)
    except KeyboardInterrupt:  # a second signal; the ranks were stopped (a checkpoint is renamed into place
        # when complete, so none is left half-written)
        log.warning("stopped by a second %s: the ranks were stopped at once, without finishing their step. %s",
                    signal.Signals(stop.signal).name, _left_on_disk(run_dir))
        raise SystemExit(128 + stop.signal) from None
    except ChildFailedError as e:
        failed, failure = e.get_first_failure()
        if stop.signal is not None and failure.exitcode == 128 + stop.signal:  # the ranks stopped as asked
            log.warning("stopped by %s: each rank finished its step. %s", signal.Signals(stop.signal).name,
                        _left_on_disk(run_dir))
            raise SystemExit(128 + stop.signal) from None
        how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        if failure.exitcode == TIMED_OUT:  # it waited for the others; the hung ones are those still running
            mine = range(t.node_rank * t.nproc_per_node, (t.node_rank + 1) * t.nproc_per_node)
            silent = [r for r in mine if r not in e.failures]
            how = (f"gave up waiting for the other ranks after launch.dist_timeout_s={t.dist_timeout_s:g} s"
                   + (f" (rank {', '.join(map(str, silent))} of this node never joined that collective: hung?)"
                      if silent else ""))
        raise DistributedError(f"rank {failed} (pid {failure.pid}) {how}; the other ranks were stopped. "
                               + _left_on_disk(run_dir)) from None
    except SignalException as e:  # (a signal torch's launcher handles itself: SIGHUP, SIGQUIT)
        log.warning("stopped by %s: the ranks were asked to stop. %s", signal.Signals(e.sigval).name,
                    _left_on_disk(run_dir))
        raise SystemExit(128 + e.sigval) from None
    finally:
        stop.restore()
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text())["final_eval"] if summary.is_file() else {}


class _PassSignalsOn(GracefulStop):
    """The launcher's GracefulStop: it also passes the first SIGINT or SIGTERM on to every rank; a second
    one raises KeyboardInterrupt, and torch's launcher stops the ranks as it unwinds. (torch's own handling
    would pass the first signal on, stop watching, and kill ranks still running 30 s later: mid-step or
    mid-checkpoint on a large model.)"""

    MESSAGE = ("%s: passed on to every rank, which finishes its step; then rank 0 writes a checkpoint (send it "
               "again to stop at once)")

    def _handle(self, signum: int, frame) -> None:
        super()._handle(signum, frame)  # (a second signal raises here; torch's launcher then sends the ranks
        # SIGTERM: a second signal for them too)
        for process in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)


def _left_on_disk(run_dir: Path) -> str:
    done = complete_checkpoints(run_dir)
    if not done:
        return "No checkpoint was written."
    return (f"The last complete checkpoint is {done[-1]}: continue with the same command plus "
            f"trainer.resume=auto hydra.run.dir={run_dir}")


def _join(cfg: TrainConfig) -> None:
    """Join the process group of the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR...),
    giving this rank its share of the machine's cores."""
    # A process group of its own: a terminal's Ctrl-C then reaches the launcher alone, which passes it on
    # to every rank once (else each rank would get it twice, and a second signal stops a rank at once).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if cfg.launch.num_threads is None and local_world > 1:  # before the engine starts: vLLM pins its threads
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_world))
    backend = "gloo"
    if cfg.launch.device in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        backend = "nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.launch.dist_timeout_s))
    if rank() != 0:  # one voice: rank 0 says what the run does; the others only what fails
        logging.getLogger("rlvr").setLevel(logging.ERROR)


def _run_rank(fn: Callable[[TrainConfig, Path], dict], cfg: TrainConfig, run_dir: Path) -> dict:
    """`fn` as one rank; then leave the group. A rank that fails exits at once (the launcher stops the
    others): waiting in a collective for peers that went on would hang. One that succeeds returns (the
    elastic launcher waits for its return value) and ends without the interpreter's teardown."""
    code, me = 0, rank()  # (closing vLLM's engine ends the process group: rank() is 0 after it)
    try:
        fn(cfg, run_dir)
    except RlvrError as e:
        log.error("rank %d: %s", me, e)
        code = 1
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        if timed_out(e):
            log.error("rank %d: a collective waited launch.dist_timeout_s=%g s for the other ranks: %s", me,
                      cfg.launch.dist_timeout_s, e)
            code = TIMED_OUT
        else:
            log.exception("rank %d failed", me)
            code = 1
    for handler in logging.root.handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0:
        os._exit(code)
    if dist.is_initialized():  # (closing vLLM's engine may have ended the group already)
        dist.barrier()
        dist.destroy_process_group()
    # Past a gloo backward, a normal interpreter exit sometimes aborts (DISTRIBUTED.md): the last
    # thing at exit (atexit runs its handlers last-registered first) is to leave at once.
    atexit.register(os._exit, 0)
    return {}


def _worker(fn: Callable[[TrainConfig, Path], dict], cfg: TrainConfig, run_dir: str, log_file: str | None) -> None:
    """The entry point of each rank that `launch` starts (a fresh interpreter; `cfg` comes pickled)."""
    _join(cfg)
    prefix = "" if rank() == 0 else f"[rank {rank()}] "
    formatter = logging.Formatter(f"[%(asctime)s][%(name)s][%(levelname)s] - {prefix}%(message)s")
    console = logging.StreamHandler()
    console.addFilter(Harmless())
    handlers: list[logging.Handler] = [console]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(logging.NOTSET if rank() == 0 else logging.ERROR)
        logging.root.addHandler(handler)
    logging.root.setLevel(logging.INFO)
    _run_rank(fn, cfg, Path(run_dir))
