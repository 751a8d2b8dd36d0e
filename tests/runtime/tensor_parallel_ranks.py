"""Run a function on N gloo ranks on the CPU, one spawned process each, and return rank 0's result.

`run_on_ranks(size, fn, *args)` starts `size` processes on a free loopback port, joins them into
one torch.distributed group, calls `fn(tp, *args)` on each with its TensorParallel and returns
what rank 0 returned; an exception on any rank is raised here with that rank's traceback, and a
group that does not finish within `timeout` seconds is killed. `fn` must be importable (a module
level function), since the ranks are spawned, not forked.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from datetime import timedelta

import torch.distributed as dist
from loopback_client import free_port
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def _rank(rank: int, size: int, port: int, fn, args: tuple, results) -> None:
    # Several ranks share a few cores: one thread each (cpu_threads.py honours OMP_NUM_THREADS).
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=COLLECTIVE_TIMEOUT,
        )
        result = fn(TensorParallel.joined(), *args)
        # Pickled here, by value: the queue's own pickler would pass tensors as shared memory that
        # dies with this process.
        results.put((rank, "ok", pickle.dumps(result) if rank == 0 else None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(size: int, fn, *args, timeout: float = 600):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(r, size, port, fn, args, results)) for r in range(size)]
    for process in ranks:
        process.start()
    try:
        outcomes = {}
        for _ in range(size):
            rank, status, value = results.get(timeout=timeout)
            if status == "error":
                raise AssertionError(f"tensor-parallel rank {rank} of {size} failed:\n{value}")
            outcomes[rank] = value
        return pickle.loads(outcomes[0])
    finally:
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
