"""Run a function on W gloo processes on 127.0.0.1 and bring its results back to pytest.

Process start-up (importing torch) costs seconds, so a test spawns one group that runs a
whole table of cases and returns every rank's results; the test process asserts on them.
A hang (a collective some rank never joins) fails the test after ``timeout`` seconds
instead of stalling CI; an exception on a rank fails it with that rank's traceback.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple, out: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        out.put((rank, "ok", pickle.dumps(result)))
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test)
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 120) -> list[Any]:
    """``[fn(rank, world, *args) for rank in range(world)]``, each in its own gloo process.

    ``fn`` must be importable by name (a module-level function) and return picklable results.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    old = os.environ.copy()
    os.environ.update(env)
    try:
        procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, out), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
    finally:
        os.environ.clear()
        os.environ.update(old)
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            try:
                rank, status, payload = out.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"{fn.__name__} on {world} gloo processes did not finish in "
                                   f"{timeout} s (a rank hangs in a collective?)") from None
            if status == "error":
                raise RuntimeError(f"rank {rank} of {world} failed:\n{payload}")
            results[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
