"""The block pool on its own: prefix hits, reference counts, least-recently-freed eviction."""

from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup


def make_seq(tokens: list[int], n: int = 1) -> Sequence:
    group = SequenceGroup("r", tokens, SamplingParams(n=n), 0.0)
    group.seqs = [Sequence(group, i) for i in range(n)]
    return group.seqs[0]


def run_prompt(bm: BlockManager, seq: Sequence) -> None:
    """Admit a sequence and pretend its whole prompt was computed."""
    prefix = bm.find_prefix(seq)
    num_new = seq.num_tokens - len(prefix) * bm.block_size
    assert bm.can_admit(seq, prefix, num_new)
    bm.admit(seq, prefix, num_new)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq)


def test_shared_prefix_is_found_and_reference_counted():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(10)))
    run_prompt(bm, a)
    assert len(a.block_table) == 3
    b = make_seq(list(range(8)) + [99, 98, 97])
    run_prompt(bm, b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    assert bm.prefix_hits == 8 and bm.prefix_queries == 21
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8 and bm.usage == 0.0


def test_whole_prompt_hit_still_leaves_a_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_seq(list(range(8)))
    run_prompt(bm, first)
    bm.free(first)
    again = make_seq(list(range(8)))
    assert len(bm.find_prefix(again)) == 1  # the second block holds the last token, which must be recomputed


def test_freed_prefixes_survive_until_evicted_least_recently_freed_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    old, new = make_seq([1, 2, 3]), make_seq([5, 6, 7])
    run_prompt(bm, old)
    bm.free(old)
    run_prompt(bm, new)
    bm.free(new)
    # Four free blocks, two of them cached ([1, 2] freed before [5, 6]); taking three evicts [1, 2].
    taker = make_seq([9, 9, 9, 9, 9, 9])
    run_prompt(bm, taker)
    assert bm.find_prefix(make_seq([1, 2, 3])) == []
    assert len(bm.find_prefix(make_seq([5, 6, 7]))) == 1


def test_without_prefix_caching_nothing_is_shared():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a, b = make_seq(list(range(9))), make_seq(list(range(9)))
    run_prompt(bm, a)
    run_prompt(bm, b)
    assert not set(a.block_table) & set(b.block_table)
    assert bm.prefix_queries == 0


def test_fork_shares_full_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    leader = make_seq(list(range(10)), n=2)
    child = leader.group.seqs[1]
    run_prompt(bm, leader)
    bm.fork(leader, child, 2)
    assert child.block_table == leader.block_table[:2] and child.num_computed_tokens == 8
    bm.append(child, 2)
    assert child.block_table[2] != leader.block_table[2]
    assert bm.num_free_blocks == 8 - 4
    bm.free(leader)
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_only_sequences_with_the_same_cache_salt_share_prefix_blocks():
    bm = BlockManager(num_blocks=16, block_size=4)

    def salted(salt):
        group = SequenceGroup("r", list(range(13)), SamplingParams(cache_salt=salt), 0.0)
        return Sequence(group, 0)

    first = salted("tenant-a")
    run_prompt(bm, first)
    assert bm.find_prefix(salted("tenant-b")) == []
    assert bm.find_prefix(salted(None)) == []
    assert bm.find_prefix(salted("tenant-a")) == first.block_table[:3]
