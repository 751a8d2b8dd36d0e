"""A rank that only computes: every rank but 0, on this machine or in a LeaderWorkerSet worker pod.

It joins the group, builds its part of the engine (rank_group.py, engine_build.py), waits until
every rank has loaded, then runs each step rank 0 sends (step_broadcast.py) until rank 0 says stop:
the target model's steps on its shard of the target, a draft model's on its shard of the draft.
It never samples, schedules or serves HTTP. Signals do not stop it: rank 0 decides when the group
ends (after draining its requests), and a rank whose rank 0 is gone exits on its own, at once on
one machine and within --distributed-timeout across pods.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.build import build_engine
from pagoda_runtime.logs import configure_logging
from pagoda_runtime.parallel.rank_group import LogSettings, RankGroup
from pagoda_runtime.parallel.step_broadcast import DRAFT_STEP, STEP, StepReceiver
from pagoda_runtime.parallel.world_layout import WorldLayout

log = logging.getLogger("pagoda.group")

_PARENT_POLL_S = 1.0


def compute(group: RankGroup, local_rank: int) -> str | None:
    """Join, load, run steps until STOP; why it failed, naming the rank, or None after a STOP."""
    rank = group.world.global_rank(local_rank)
    try:
        member = group.join(local_rank)
        parts = build_engine(member.engine_config, tp=member.tp)
        group.all_loaded(member)
        receiver = StepReceiver(member.tp, member.device, parts.runner.receive_lora, parts.runner.dtype)
        runners = {STEP: parts.runner, DRAFT_STEP: parts.draft_runner}
        while (received := receiver.receive()) is not None:
            kind, step = received
            runners[kind].run(step)
    except Exception as exc:
        return f"rank {rank} failed: " + " ".join(f"{type(exc).__name__}: {exc}".split())
    log.info("rank %d: rank 0 ended the group; exiting", rank)
    return None


def spawned_rank(
    world: WorldLayout,
    local_rank: int,
    engine_config: EngineConfig,
    logs: LogSettings,
    parent: int,
    failures: multiprocessing.SimpleQueue,
) -> None:
    """Entry of local ranks 1.. that a node's main process started; a failure is also put on
    `failures`, for the main process's termination message."""
    # The main process decides when the group ends; a Ctrl-C or SIGTERM sent to the whole
    # process group must not take a rank away from the drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = world.global_rank(local_rank)
    configure_logging(logs.log_format, logs.level, rank=rank)
    threading.Thread(target=_exit_with_parent, args=(parent, rank), daemon=True).start()
    failure = compute(RankGroup(world, engine_config, logs, None), local_rank)
    if failure is not None:
        log.critical(failure)
        failures.put(failure)
    logging.shutdown()
    # torch.distributed's threads may still hold the group: leave without waiting for them.
    os._exit(0 if failure is None else 1)


def serve_worker_node(group: RankGroup) -> int:
    """A LeaderWorkerSet worker pod: its local ranks, no HTTP; the status the pod exits with."""
    world = group.world

    def on_signal(sig: int, _frame) -> None:
        log.info(
            "signal %d: this worker pod's ranks keep computing until rank 0 ends the group after its "
            "drain, or until rank 0 is gone",
            sig,
        )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "worker pod %d of %d: global ranks %d-%d of %d; rank 0 is at %s:%d; no HTTP is served here",
        world.node_index,
        world.num_nodes,
        world.global_rank(0),
        world.global_rank(world.local_size - 1),
        world.tensor_parallel_size,
        world.leader_address,
        world.port,
    )
    group.start(spawned_rank)
    failure = compute(group, 0)
    if failure is not None:
        group.fail(f"{failure}; this worker pod exits for the group to restart")
    return group.finish(0)


def _exit_with_parent(parent: int, rank: int) -> None:
    # Linux's parent-death signal fires when the parent's spawning thread ends, which is the
    # loader thread, not the server: poll the parent instead.
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    log.critical("rank %d: the process that started it (pid %d) is gone; exiting", rank, parent)
    logging.shutdown()
    os._exit(1)
