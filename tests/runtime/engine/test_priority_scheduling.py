"""--scheduling-policy priority in the scheduler: the waiting order, which running sequence is
preempted, a waiting request preempting a worse one for its place, and ageing against starvation."""

import random

import pytest
from pagoda_runtime.engine.priority import AGEING_S
from pagoda_runtime.engine.sequence import SequenceStatus

from .test_scheduler import Simulation, all_free


def waiting_ids(sim):
    return [seq.group.request_id for seq in sim.scheduler.waiting]


def test_waiting_requests_are_ordered_by_priority_then_arrival():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, policy="priority")
    sim.add([1], 4, priority=5, arrival=0.0)  # r0
    sim.add([1], 4, priority=0, arrival=1.0)  # r1
    sim.add([1], 4, priority=3, arrival=2.0)  # r2
    sim.add([1], 4, priority=0, arrival=3.0)  # r3: ties with r1, arrived later
    sim.add([1], 4, priority=-1, arrival=4.0)  # r4
    assert waiting_ids(sim) == ["r4", "r1", "r3", "r2", "r0"]


def test_first_come_first_served_ignores_priority():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=8, budget=64)
    sim.add([1], 4, priority=5, arrival=0.0)
    sim.add([1], 4, priority=0, arrival=1.0)
    assert waiting_ids(sim) == ["r0", "r1"]


def test_a_higher_priority_request_preempts_the_worst_running_one_for_its_place():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=2, budget=64, policy="priority")
    batch_a = sim.add([1, 2, 3], 50, priority=10, arrival=0.0).seqs[0]
    batch_b = sim.add([4, 5, 6], 50, priority=10, arrival=1.0).seqs[0]
    sim.step()
    sim.step()
    assert batch_a.status == batch_b.status == SequenceStatus.RUNNING
    chat = sim.add([7, 8], 5, priority=0, arrival=2.0).seqs[0]
    sim.step()
    # Both slots were taken: the later of the two batch requests gave its place at once.
    assert chat.status == SequenceStatus.RUNNING and chat.num_output_tokens == 1
    assert batch_b.status == SequenceStatus.WAITING and batch_a.status == SequenceStatus.RUNNING
    assert sim.scheduler.num_preemptions == 1
    sim.run()
    assert batch_b.num_output_tokens == 50 and all_free(sim)


def test_an_equal_priority_request_waits_for_a_free_place():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=1, budget=64, policy="priority")
    first = sim.add([1, 2, 3], 5, priority=1, arrival=0.0).seqs[0]
    sim.step()
    second = sim.add([4, 5], 5, priority=1, arrival=1.0).seqs[0]
    sim.step()
    assert first.status == SequenceStatus.RUNNING and second.status == SequenceStatus.WAITING
    assert sim.scheduler.num_preemptions == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_memory_pressure_preempts_the_lowest_priority_running_sequence(policy):
    # Three one-block prompts and one block to spare: at the third step each needs a second block,
    # so the first takes the spare and the second makes room by preempting one of the others.
    sim = Simulation(
        num_blocks=4, block_size=4, max_num_seqs=8, budget=64, prefix_caching=False, policy=policy
    )
    low = sim.add([1, 2, 3], 8, priority=2, arrival=0.0).seqs[0]
    high = sim.add([4, 5, 6], 8, priority=0, arrival=1.0).seqs[0]
    middle = sim.add([7, 8, 9], 8, priority=1, arrival=2.0).seqs[0]
    sim.step()  # three prefills, each samples its 4th token
    sim.step()  # the 4th tokens fill the blocks
    assert sim.scheduler.num_preemptions == 0
    sim.step()
    preempted = [s for s in (low, high, middle) if s.num_preemptions]
    # fcfs preempts the newest arrival; priority the lowest priority, however early it came.
    assert preempted == ([middle] if policy == "fcfs" else [low])
    sim.run()
    assert all(s.num_output_tokens == 8 for s in (low, high, middle)) and all_free(sim)


def test_among_equal_priorities_the_latest_arrival_is_preempted():
    sim = Simulation(
        num_blocks=4, block_size=4, max_num_seqs=8, budget=64, prefix_caching=False, policy="priority"
    )
    seqs = [sim.add([i, i, i], 8, priority=1, arrival=float(i)).seqs[0] for i in range(3)]
    for _ in range(3):
        sim.step()
    assert [s.num_preemptions for s in seqs] == [0, 0, 1]


def test_ageing_a_waiting_request_outranks_later_urgent_ones_after_ageing_s_per_level():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, policy="priority")
    sim.add([1], 4, priority=2, arrival=0.0)  # r0
    sim.add([1], 4, priority=0, arrival=2 * AGEING_S - 1)  # r1: two levels better, arrived just in time
    sim.add([1], 4, priority=0, arrival=2 * AGEING_S + 1)  # r2: too late to pass r0
    sim.add([1], 4, priority=1, arrival=AGEING_S + 3)  # r3: one level better, too late as well
    assert waiting_ids(sim) == ["r1", "r0", "r2", "r3"]


def test_a_low_priority_request_is_not_starved_by_an_endless_stream_of_urgent_ones():
    # One place, and two urgent one-token requests arriving per step of one simulated second: more
    # than can be served, so without ageing the low-priority request would wait forever.
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=1, budget=64, policy="priority")
    low = sim.add([1, 2], 1, priority=1, arrival=0.0).seqs[0]
    ran_at = None
    for step in range(4 * int(AGEING_S)):
        for _ in range(2):
            sim.add([3, 4], 1, priority=0, arrival=float(step))
        sim.step()
        if low.is_finished:
            ran_at = step
            break
    assert ran_at is not None, "the low-priority request starved"
    # Served behind every urgent request that arrived within AGEING_S of it, and no others.
    assert 2 * AGEING_S - 2 <= ran_at <= 2 * AGEING_S + 2


@pytest.mark.parametrize("overlapped", [False, True], ids=["in-order", "async-scheduling"])
def test_random_prioritized_workload_under_memory_pressure_finishes_everything(overlapped):
    rng = random.Random(1)
    sim = Simulation(24, 4, max_num_seqs=4, budget=16, overlapped=overlapped, policy="priority")
    groups = []
    for i in range(30):
        prompt = [rng.randrange(50) for _ in range(rng.randint(1, 30))]
        group = sim.add(
            prompt, rng.randint(1, 20), n=rng.choice([1, 1, 2]), priority=rng.randrange(3), arrival=i
        )
        groups.append(group)
        if i % 3 == 0:
            sim.step()
    sim.run()
    assert sim.scheduler.num_preemptions > 0
    for group in groups:
        for seq in group.seqs:
            assert seq.status == SequenceStatus.FINISHED and seq.num_output_tokens == group.params.max_tokens
    assert all_free(sim)


def test_a_long_low_priority_prompt_leaves_budget_for_an_urgent_one():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=4, budget=8, policy="priority")
    batch = sim.add(list(range(40)), 5, priority=5, arrival=0.0).seqs[0]
    sim.step()  # the first 8-token chunk of its prompt
    chat = sim.add([1, 2, 3, 4], 5, priority=0, arrival=1.0).seqs[0]
    step = sim.scheduler.schedule()
    # Without the reservation the batch prompt's next chunk would take all 8 tokens of the step.
    assert step.seqs == [batch, chat] and step.num_new_tokens == [4, 4]
