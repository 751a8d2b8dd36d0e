"""The parallel layout from flags and the environment LeaderWorkerSet injects into its pods."""

from __future__ import annotations

import pytest
from pagoda_runtime.parallel.world_layout import LayoutError, world_layout

LWS = {"LWS_LEADER_ADDRESS": "llama-0.llama.default", "LWS_GROUP_SIZE": "2"}


def test_one_machine_runs_every_rank_locally_and_meets_on_loopback():
    world = world_layout(4, 29501, 60.0, env={})
    assert (world.num_nodes, world.local_size, world.node_index, world.is_leader) == (1, 4, 0, True)
    assert [world.global_rank(r) for r in range(4)] == [0, 1, 2, 3]
    assert world.init_method == "tcp://127.0.0.1:29501" and world.describe() == "1x4"
    assert not world_layout(1, env={}).is_group


@pytest.mark.parametrize(("index", "ranks"), [("0", [0, 1]), ("1", [2, 3])])
def test_a_leaderworkerset_pod_holds_its_share_of_the_global_ranks(index, ranks):
    world = world_layout(4, env={**LWS, "LWS_WORKER_INDEX": index})
    assert (world.num_nodes, world.local_size, world.is_leader) == (2, 2, index == "0")
    assert [world.global_rank(r) for r in range(world.local_size)] == ranks
    assert world.init_method == "tcp://llama-0.llama.default:29500" and world.describe() == "2x2"


@pytest.mark.parametrize(
    ("size", "env", "message"),
    [
        (3, {**LWS, "LWS_WORKER_INDEX": "0"}, "does not split evenly over LWS_GROUP_SIZE=2 pods"),
        (4, {**LWS, "LWS_WORKER_INDEX": "2"}, "LWS_WORKER_INDEX=2 is outside a group of"),
        (4, {**LWS, "LWS_WORKER_INDEX": "one"}, "LWS_WORKER_INDEX must be a whole number"),
        (4, LWS, "but not LWS_WORKER_INDEX"),
        (0, {}, "--tensor-parallel-size must be at least 1"),
    ],
)
def test_a_layout_that_cannot_run_is_refused_with_what_to_change(size, env, message):
    with pytest.raises(LayoutError, match=message):
        world_layout(size, env=env)


def test_each_rank_takes_its_own_device_and_one_pinned_gpu_is_refused():
    from pagoda_runtime.parallel.rank_group import rank_device

    assert [rank_device("cpu", r, 2) for r in range(2)] == ["cpu", "cpu"]
    with pytest.raises(LayoutError, match="--device cuda:1 pins one GPU, but each of the 2 ranks"):
        rank_device("cuda:1", 0, 2)
