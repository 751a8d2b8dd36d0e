"""Sliding-window KV blocks: a window layer keeps only the blocks its next token still reads, so its
memory is bounded by the window however long the context grows; the blocks behind the window go
back to the pool (and stay findable by the prefix cache), and full-attention layers of the same
model keep every block in a pool of their own."""

import pytest
from pagoda_runtime.contract.sizing import KVPools
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import Scheduler
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup
from pagoda_runtime.engine.window_block_manager import (
    NO_BLOCK,
    HybridBlockManager,
    WindowBlockManager,
    _WindowTable,
    make_block_manager,
)

BS = 4
WINDOW = 8  # a token reads itself and the 7 before it: at most 3 blocks of 4


def seq(tokens: list[int]) -> Sequence:
    group = SequenceGroup("r", tokens, SamplingParams(), 0.0)
    s = Sequence(group, 0)
    group.seqs.append(s)
    return s


def run(bm, s: Sequence, num_new: int) -> None:
    """What the scheduler and the engine do for one step of `s`."""
    assert bm.can_append(s, num_new)
    bm.append(s, num_new)
    s.num_computed_tokens += num_new
    bm.cache_computed_blocks(s)


def decode_to(bm, s: Sequence, length: int) -> None:
    while s.num_computed_tokens < length:
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)
        run(bm, s, 1)


def held(table: list[int]) -> list[int]:
    return [b for b in table if b != NO_BLOCK]


def test_a_window_pool_holds_only_the_window_however_long_the_context():
    bm = WindowBlockManager(num_blocks=8, block_size=BS, window=WINDOW)
    s = seq(list(range(10)))
    bm.admit(s, bm.find_prefix(s), 10)
    s.num_computed_tokens = 10
    decode_to(bm, s, 200)  # 50 blocks of context in a pool of 8
    first = (s.num_computed_tokens - 1 - WINDOW + 1) // BS
    assert all(b == NO_BLOCK for b in s.block_table[:first])
    assert len(held(s.block_table)) <= -(-(WINDOW - 1) // BS) + 1
    assert bm.num_free_blocks == bm.num_blocks - len(held(s.block_table))
    bm.free(s)
    assert bm.num_free_blocks == bm.num_blocks


def test_a_hybrid_model_keeps_every_block_of_its_full_layers_and_the_window_of_the_others():
    bm = HybridBlockManager(num_blocks=40, window_blocks=6, block_size=BS, window=WINDOW)
    s = seq(list(range(30)))
    bm.admit(s, bm.find_prefix(s), 7)
    while s.num_computed_tokens < s.num_tokens:
        step = min(7, s.num_tokens - s.num_computed_tokens)
        if s.num_computed_tokens:
            bm.append(s, step)
        s.num_computed_tokens += step
        bm.cache_computed_blocks(s)
    decode_to(bm, s, 100)
    assert len(s.block_table) == 25 and NO_BLOCK not in s.block_table
    assert len(s.window_block_table) == 25 and len(held(s.window_block_table)) <= 3
    # Another sequence needs more window blocks than remain: the manager says no, so the scheduler
    # preempts instead of writing into a block another sequence still reads.
    other = seq(list(range(50, 80)))
    assert not bm.can_admit(other, [], 30)
    bm.free(s)
    assert bm.num_free_blocks == 40 and bm.window_pool.num_free_blocks == 6


def test_the_prefix_cache_finds_the_window_a_prompt_needs_after_its_blocks_were_released():
    bm = HybridBlockManager(num_blocks=40, window_blocks=12, block_size=BS, window=WINDOW)
    prompt = list(range(24))
    first = seq(prompt)
    bm.admit(first, bm.find_prefix(first), 24)
    first.num_computed_tokens = 24
    bm.cache_computed_blocks(first)
    decode_to(bm, first, 40)  # releases the window blocks of the prompt
    assert NO_BLOCK in first.window_block_table[:6]
    second = seq(prompt + [99])
    prefix = bm.find_prefix(second)
    # All 6 prompt blocks: the full pool holds them, the window pool the 2 or 3 the next token reads.
    assert len(prefix) == 6
    window = bm.window_pool.find_prefix(_WindowTable(second), len(prefix))
    assert window[:3] == [NO_BLOCK] * 3 and NO_BLOCK not in window[4:]
    assert bm.can_admit(second, prefix, 1)
    bm.admit(second, prefix, 1)
    assert second.num_computed_tokens == 24


def test_a_sample_forks_only_while_its_leader_still_holds_the_window():
    bm = WindowBlockManager(num_blocks=16, block_size=BS, window=WINDOW, enable_prefix_caching=False)
    leader = seq(list(range(13)))
    bm.admit(leader, [], 13)
    leader.num_computed_tokens = 13
    assert bm.forkable_blocks(leader, 3) == 3
    decode_to(bm, leader, 30)
    assert bm.forkable_blocks(leader, 3) == 0


def test_the_scheduler_preempts_when_the_window_pool_runs_out():
    # Five window blocks: one sequence's window and step, not two.
    bm = make_block_manager(KVPools(40, 5), BS, WINDOW, True, max_model_len=40, max_num_batched_tokens=4)
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=4)
    for first in (0, 100):
        scheduler.add(seq(list(range(first, first + 8))))
    for _ in range(30):
        batch = scheduler.schedule()
        scheduler.update(batch)
        for s in batch.seqs:
            if s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(1)
    assert scheduler.num_preemptions > 0
    assert all(len(held(s.window_block_table)) <= 4 for s in scheduler.running)


def test_a_window_pool_too_small_for_one_sequence_is_refused_at_start_up():
    with pytest.raises(ValueError, match="blocks for the sliding-window layers.*--kv-cache-memory"):
        make_block_manager(KVPools(100, 2), BS, WINDOW, True, max_model_len=64, max_num_batched_tokens=16)
    assert type(make_block_manager(KVPools(10), BS, None, True, 40, 16)) is BlockManager
