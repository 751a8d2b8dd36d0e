"""This node's part of a tensor-parallel group: its rank processes, joining the group, and ending it.

The node's main process (the server on the leader, the worker pod's process under LeaderWorkerSet)
is its local rank 0 and starts local ranks 1..local_size-1 itself (spawned: CUDA cannot be forked),
one GPU each (`cuda:<local rank>`), NCCL between GPUs and gloo on the CPU. It watches them: a rank
that exits while the group serves ends the node at once, with one line naming the rank, written to
the termination-message file too, and a non-zero status, because the group cannot compute without
it. A rank on another node that dies shows up as a failed collective, or as one that outlasts
--distributed-timeout, and ends the node the same way. Only rank 0's STOP (after a drain) ends
the ranks cleanly, with status 0.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.executor.cpu_threads import cpu_thread_count
from pagoda_runtime.executor.devices import resolve_device
from pagoda_runtime.executor.model_runner import ModelRunner
from pagoda_runtime.parallel.step_broadcast import DraftStepSender, StepSender, keepalive_interval
from pagoda_runtime.parallel.tensor_parallel import TensorParallel
from pagoda_runtime.parallel.world_layout import LayoutError, WorldLayout
from pagoda_runtime.termination import write_termination_message

log = logging.getLogger("pagoda.group")

# How long the ranks of this node get to exit after rank 0's STOP before they are killed.
_STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Member:
    """One process's place in the group, once it joined."""

    tp: TensorParallel
    engine_config: EngineConfig  # with this rank's own device
    device: torch.device


@dataclass(frozen=True)
class LogSettings:
    """How the spawned ranks log: as the main process does, each line tagged with its rank."""

    log_format: str
    level: str


def rank_device(device: str, local_rank: int, local_size: int) -> str:
    """The --device of one rank: its own GPU, cuda:<local rank>, or the CPU."""
    if device.startswith("cuda:"):
        raise LayoutError(
            f"--device {device} pins one GPU, but each of the {local_size} ranks on this node takes "
            "its own (cuda:<local rank>); use --device cuda or auto"
        )
    resolved = resolve_device("cuda" if device == "cuda" else device)
    if resolved.type != "cuda":
        return str(resolved)
    if torch.cuda.device_count() < local_size:
        raise LayoutError(
            f"{local_size} ranks run on this node, one GPU each, but torch sees "
            f"{torch.cuda.device_count()}; lower --tensor-parallel-size or give the pod more GPUs"
        )
    return f"cuda:{local_rank}"


class RankGroup:
    def __init__(
        self,
        world: WorldLayout,
        engine_config: EngineConfig,
        log_settings: LogSettings,
        termination_log: str | None,
    ) -> None:
        self.world = world
        self.engine_config = engine_config
        self.log_settings = log_settings
        self.termination_log = termination_log
        self.sender: StepSender | None = None
        self._processes: dict[int, multiprocessing.Process] = {}  # global rank -> process
        self._failures: multiprocessing.SimpleQueue | None = None  # why a spawned rank failed
        self._stopping = threading.Event()
        self._failing = threading.Lock()

    # ---- this node's processes ---------------------------------------------------------------

    def start(self, rank_main: Callable[..., None]) -> None:
        """Start local ranks 1..local_size-1, each a spawned process running `rank_main`
        (rank_worker.spawned_rank), and watch them."""
        if self.world.local_size == 1:
            return
        context = multiprocessing.get_context("spawn")
        self._failures = context.SimpleQueue()
        for local_rank in range(1, self.world.local_size):
            rank = self.world.global_rank(local_rank)
            process = context.Process(
                target=rank_main,
                args=(
                    self.world,
                    local_rank,
                    self.engine_config,
                    self.log_settings,
                    os.getpid(),
                    self._failures,
                ),
                name=f"pagoda-rank-{rank}",
            )
            process.start()
            self._processes[rank] = process
        threading.Thread(target=self._watch, name="pagoda-rank-watch", daemon=True).start()

    def _watch(self) -> None:
        by_sentinel = {p.sentinel: (rank, p) for rank, p in self._processes.items()}
        ended = multiprocessing.connection.wait(list(by_sentinel))
        if self._stopping.is_set():
            return
        rank, process = by_sentinel[ended[0]]
        process.join()
        # A rank that failed by itself said why (the model, the device, the group): that is the
        # reason worth a termination message, not only that it exited.
        reason = "" if self._failures.empty() else f" ({self._failures.get()})"
        self.fail(
            f"rank {rank} (pid {process.pid}) {_how_it_ended(process.exitcode)}{reason}; the "
            "tensor-parallel group cannot compute without it, so this node exits for its pod to restart"
        )

    def fail(self, message: str) -> NoReturn:
        """End this node now: the line in the log and the termination message, every local rank
        killed, status 1. A collective may hold the engine's thread, so nothing waits for it."""
        with self._failing:
            log.critical(message)
            write_termination_message(self.termination_log, message)
            for process in self._processes.values():
                if process.is_alive():
                    process.kill()
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(1)

    def finish(self, exit_code: int) -> int:
        """After this node's own part ended with `exit_code`: on rank 0, tell every rank to stop;
        then wait for this node's ranks. The status the process exits with."""
        self._stopping.set()
        if self.sender is not None:
            try:
                self.sender.stop()
            except Exception as exc:
                log.error("could not tell the other ranks to stop: %s", exc)
                exit_code = exit_code or 1
        elif exit_code != 0:
            # Rank 0 never led the group (its start failed), or this node failed: nobody will
            # tell these ranks to stop.
            for process in self._processes.values():
                process.kill()
        for rank, process in self._processes.items():
            process.join(_STOP_GRACE_S)
            if process.exitcode is None:
                log.error("rank %d did not exit within %gs of the stop; killing it", rank, _STOP_GRACE_S)
                process.kill()
                process.join()
            if process.exitcode != 0:
                log.error("rank %d %s", rank, _how_it_ended(process.exitcode))
                exit_code = exit_code or 1
        # This process may lead another group later (an offline LLM after the last one's shutdown).
        if dist.is_initialized():
            dist.destroy_process_group()
        return exit_code

    # ---- torch.distributed -------------------------------------------------------------------

    def join(self, local_rank: int) -> Member:
        """Join the group as `local_rank` of this node: this rank's device, then the rendezvous."""
        world = self.world
        rank = world.global_rank(local_rank)
        config = replace(
            self.engine_config, device=rank_device(self.engine_config.device, local_rank, world.local_size)
        )
        device = torch.device(config.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        elif "OMP_NUM_THREADS" not in os.environ:
            # The ranks of a node share its cores; each gets its share, not all of them.
            threads = max(1, cpu_thread_count() // world.local_size)
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        try:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                init_method=world.init_method,
                rank=rank,
                world_size=world.tensor_parallel_size,
                timeout=timedelta(seconds=world.timeout_s),
                device_id=device if device.type == "cuda" else None,
            )
        except Exception as exc:
            raise RuntimeError(
                f"rank {rank}: the tensor-parallel group of {world.tensor_parallel_size} did not form at "
                f"{world.leader_address}:{world.port} within {world.timeout_s:g}s (is every pod of the "
                f"group running, and the port open?): {' '.join(str(exc).split())}"
            ) from exc
        log.info(
            "rank %d of %d (pid %d, %s) joined the group at %s",
            rank,
            world.tensor_parallel_size,
            os.getpid(),
            device,
            world.init_method,
        )
        return Member(TensorParallel.joined(), config, device)

    def all_loaded(self, member: Member) -> None:
        """Wait until every rank holds its part of the model (rank 0 is ready only after this)."""
        device_ids = [member.device.index] if member.device.type == "cuda" else None
        dist.barrier(device_ids=device_ids)

    def lead(self, member: Member, runner: ModelRunner, draft_runner: ModelRunner | None = None) -> None:
        """Rank 0, every rank loaded: from now on each step goes to the others first, a draft
        model's (`draft_runner`, speculative decoding) as the target's."""
        self.all_loaded(member)
        keepalive = keepalive_interval(self.world.timeout_s)
        self.sender = StepSender(member.tp, member.device, keepalive, self.fail)
        runner.step_sender = self.sender
        if draft_runner is not None:
            draft_runner.step_sender = DraftStepSender(self.sender)
        log.info(
            "all %d ranks joined and loaded the model (%s nodes x local ranks)",
            self.world.tensor_parallel_size,
            self.world.describe(),
        )


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"
