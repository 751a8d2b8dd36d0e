"""Where the ranks of one tensor-parallel group run: how many nodes, how many ranks on each, and
where they meet.

On one machine the serving process is rank 0 and starts ranks 1..N-1 itself. Under LeaderWorkerSet
the group spans the pods of one LWS group, read from the variables LWS injects into every pod
(LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX): each pod runs N / LWS_GROUP_SIZE ranks, pod k
holds global ranks k * local_size .. (k + 1) * local_size - 1, and all of them meet at the leader
pod's --distributed-port. Parsed once at the edge (flags and environment); torch-free, so that the
operator can import the same rules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pagoda_runtime.contract.names import (
    DISTRIBUTED_PORT,
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    LWS_VARIABLES,
    LWS_WORKER_INDEX,
)
from pagoda_runtime.contract.serve_settings import DEFAULT_DISTRIBUTED_TIMEOUT_S


class LayoutError(ValueError):
    """A parallel layout that cannot run; the message says what to change, in one sentence."""


@dataclass(frozen=True)
class WorldLayout:
    tensor_parallel_size: int
    num_nodes: int  # pods of the LWS group, 1 on one machine
    node_index: int  # this pod's LWS_WORKER_INDEX, 0 on the leader and on one machine
    leader_address: str  # where rank 0 listens for the group's rendezvous
    port: int
    timeout_s: float

    @property
    def local_size(self) -> int:
        """Ranks on this node, one per GPU (local rank r uses cuda:r)."""
        return self.tensor_parallel_size // self.num_nodes

    @property
    def is_leader(self) -> bool:
        """The node of rank 0: it owns the scheduler and the HTTP server."""
        return self.node_index == 0

    @property
    def is_group(self) -> bool:
        """Whether more than one rank runs, so that processes and collectives are needed."""
        return self.tensor_parallel_size > 1

    def global_rank(self, local_rank: int) -> int:
        return self.node_index * self.local_size + local_rank

    @property
    def init_method(self) -> str:
        host = f"[{self.leader_address}]" if ":" in self.leader_address else self.leader_address
        return f"tcp://{host}:{self.port}"

    def describe(self) -> str:
        """For the start-up banner: nodes x local ranks."""
        return f"{self.num_nodes}x{self.local_size}"


def world_layout(
    tensor_parallel_size: int,
    port: int = DISTRIBUTED_PORT,
    timeout_s: float = DEFAULT_DISTRIBUTED_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> WorldLayout:
    """The layout from the flags and, where LWS started this pod, its environment."""
    env = os.environ if env is None else env
    if tensor_parallel_size < 1:
        raise LayoutError(f"--tensor-parallel-size must be at least 1, not {tensor_parallel_size}")
    if not 0 < port < 65536:
        raise LayoutError(f"--distributed-port must be a TCP port (1-65535), not {port}")
    if not timeout_s > 0:
        raise LayoutError(f"--distributed-timeout must be a positive number of seconds, not {timeout_s:g}")
    present = [name for name in LWS_VARIABLES if env.get(name, "") != ""]
    if not present:
        return WorldLayout(tensor_parallel_size, 1, 0, "127.0.0.1", port, timeout_s)
    if len(present) != len(LWS_VARIABLES):
        missing = ", ".join(name for name in LWS_VARIABLES if name not in present)
        raise LayoutError(
            f"the environment sets {', '.join(present)} but not {missing}; "
            "a LeaderWorkerSet pod has all three"
        )
    group_size = _whole(env, LWS_GROUP_SIZE, minimum=1)
    worker_index = _whole(env, LWS_WORKER_INDEX, minimum=0)
    if worker_index >= group_size:
        raise LayoutError(
            f"{LWS_WORKER_INDEX}={worker_index} is outside a group of {LWS_GROUP_SIZE}={group_size} pods"
        )
    if tensor_parallel_size % group_size:
        raise LayoutError(
            f"--tensor-parallel-size {tensor_parallel_size} does not split evenly over "
            f"{LWS_GROUP_SIZE}={group_size} pods; use a multiple of {group_size}"
        )
    leader = env[LWS_LEADER_ADDRESS]
    return WorldLayout(tensor_parallel_size, group_size, worker_index, leader, port, timeout_s)


def _whole(env: Mapping[str, str], name: str, minimum: int) -> int:
    try:
        value = int(env[name])
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise LayoutError(f"{name} must be a whole number of at least {minimum}, not {env[name]!r}")
    return value
