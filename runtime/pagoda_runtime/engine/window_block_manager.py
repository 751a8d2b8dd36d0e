"""KV blocks of sliding-window layers: only the window is kept.

A layer whose window is W tokens reads, for a token at position p, only the keys at p - W + 1 .. p.
When a sequence is appended to, every block of its table that lies wholly before the window of its
next token is handed back to the pool and its entry becomes NO_BLOCK (tables stay indexed by
position), so a sequence holds at most ceil((W - 1) / block_size) + 1 window blocks besides those
of the step it runs: the window layers' KV memory is bounded by the window, not the context.
Released blocks keep their prefix-cache hashes like any freed block, so a later prompt that shares
the prefix finds the window it needs.

- WindowBlockManager: the block manager of a model whose every layer slides, and the window pool of
  a hybrid model.
- HybridBlockManager: full-attention and sliding-window layers in pools of their own (Gemma 2 and
  3; Qwen2 and Qwen3 with max_window_layers), one table per pool on each sequence
  (Sequence.block_table, Sequence.window_block_table); the scheduler sees one manager.

Plain Python, no torch.
"""

from __future__ import annotations

import logging

from pagoda_runtime.contract.sizing import KVPools, window_blocks_needed
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.engine.state_block_manager import StateBlockManager

logger = logging.getLogger(__name__)

NO_BLOCK = -1  # a table entry whose block lies wholly outside the window and was handed back


class WindowBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, window: int, enable_prefix_caching: bool = True):
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.window = window

    def first_needed(self, position: int) -> int:
        """The first block a token at `position` reads."""
        return max(0, position - self.window + 1) // self.block_size

    def _outside(self, seq: Sequence) -> list[int]:
        """Table indices of the blocks the sequence's next token no longer reads (released ones form
        a prefix of the table, so the walk stops at the first NO_BLOCK)."""
        table = seq.block_table
        i = min(self.first_needed(seq.num_computed_tokens), len(table)) - 1
        indices = []
        while i >= 0 and table[i] != NO_BLOCK:
            indices.append(i)
            i -= 1
        return indices[::-1]

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        freed = sum(1 for i in self._outside(seq) if self.blocks[seq.block_table[i]].ref_count == 1)
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks + freed

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        for i in self._outside(seq):
            self._release(seq.block_table[i])
            seq.block_table[i] = NO_BLOCK
        super().append(seq, num_new_tokens)

    def find_prefix(self, seq: Sequence, limit: int | None = None) -> list[int]:
        """The longest cached prefix of at most `limit` blocks whose window is cached: NO_BLOCK for
        the blocks before it, the cached blocks of the window after."""
        if not self.enable_prefix_caching:
            return []
        most = (seq.num_tokens - 1) // self.block_size
        if limit is not None:
            most = min(most, limit)
        self._extend_hashes(seq, most)
        hits: list[int | None] = []
        for i, h in enumerate(seq.block_hashes[:most]):
            block_id = self._by_hash.get(h)
            start = i * self.block_size
            if block_id is not None and self.blocks[block_id].token_ids == tuple(
                seq.token_ids[start : start + self.block_size]
            ):
                hits.append(block_id)
            else:
                hits.append(None)
        run = 0  # cached blocks in a row ending at block n - 1
        best = 0
        for n, hit in enumerate(hits, start=1):
            run = run + 1 if hit is not None else 0
            if run >= n - self.first_needed(n * self.block_size):
                best = n
        first = self.first_needed(best * self.block_size)
        return [NO_BLOCK] * first + hits[first:best]

    def can_admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> bool:
        reclaimed = sum(1 for b in prefix if b != NO_BLOCK and self.blocks[b].ref_count == 0)
        total = -(-(len(prefix) * self.block_size + num_new_tokens) // self.block_size)
        return total - len(prefix) + reclaimed <= self.num_free_blocks

    def admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> None:
        assert not seq.block_table, "a sequence is admitted only while it holds no blocks"
        for block_id in prefix:
            if block_id != NO_BLOCK:
                self._take(block_id)
        seq.block_table = list(prefix)
        seq.num_computed_tokens = len(prefix) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed_tokens
        self.append(seq, num_new_tokens)

    def forkable_blocks(self, parent: Sequence, num_blocks: int) -> int:
        """`num_blocks` when the parent still holds the window a child forked there reads, else 0."""
        first = self.first_needed(num_blocks * self.block_size)
        if all(b != NO_BLOCK for b in parent.block_table[first:num_blocks]):
            return num_blocks
        return 0

    def fork(self, parent: Sequence, child: Sequence, num_blocks: int) -> None:
        assert not child.block_table and num_blocks * self.block_size <= parent.num_computed_tokens
        first = self.first_needed(num_blocks * self.block_size)
        for block_id in parent.block_table[first:num_blocks]:
            self._take(block_id)
        child.block_table = [NO_BLOCK] * first + parent.block_table[first:num_blocks]
        child.block_hashes = parent.block_hashes[:num_blocks]
        child.num_computed_tokens = num_blocks * self.block_size

    def cache_computed_blocks(self, seq: Sequence) -> None:
        if not self.enable_prefix_caching:
            return
        # Computed but not read (a pending token, a verify step's draft tokens): not hashable yet.
        num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        self._extend_hashes(seq, num_full)
        for i in range(num_full):
            if seq.block_table[i] != NO_BLOCK:
                self._publish(seq, i)

    def free(self, seq: Sequence) -> None:
        seq.block_table = [b for b in seq.block_table if b != NO_BLOCK]
        super().free(seq)


class _WindowTable:
    """A sequence as the window pool of a hybrid manager sees it: its window table in place of its
    block table, everything else its own."""

    __slots__ = ("seq",)

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq

    @property
    def block_table(self) -> list[int]:
        return self.seq.window_block_table

    @block_table.setter
    def block_table(self, table: list[int]) -> None:
        self.seq.window_block_table = table

    @property
    def block_hashes(self) -> list[int]:
        return self.seq.block_hashes

    @block_hashes.setter
    def block_hashes(self, hashes: list[int]) -> None:
        self.seq.block_hashes = hashes

    @property
    def num_computed_tokens(self) -> int:
        return self.seq.num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, n: int) -> None:
        self.seq.num_computed_tokens = n

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def group(self):
        return self.seq.group

    @property
    def num_tokens(self) -> int:
        return self.seq.num_tokens


class HybridBlockManager(BlockManager):
    """The full-attention pool (this manager itself) and the window pool (`window_pool`), moved
    together: a sequence runs only when both have its blocks, and both agree on its prefix."""

    def __init__(
        self,
        num_blocks: int,
        window_blocks: int,
        block_size: int,
        window: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.window_pool = WindowBlockManager(window_blocks, block_size, window, enable_prefix_caching)

    @property
    def usage(self) -> float:
        return max(super().usage, self.window_pool.usage)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return super().can_append(seq, num_new_tokens) and self.window_pool.can_append(
            _WindowTable(seq), num_new_tokens
        )

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        super().append(seq, num_new_tokens)
        self.window_pool.append(_WindowTable(seq), num_new_tokens)

    def find_prefix(self, seq: Sequence) -> list[int]:
        full = super().find_prefix(seq)
        return full[: len(self.window_pool.find_prefix(_WindowTable(seq), len(full)))]

    def can_admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> bool:
        window = self.window_pool.find_prefix(_WindowTable(seq), len(prefix))
        return super().can_admit(seq, prefix, num_new_tokens) and self.window_pool.can_admit(
            _WindowTable(seq), window, num_new_tokens
        )

    def admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> None:
        window = self.window_pool.find_prefix(_WindowTable(seq), len(prefix))
        assert len(window) == len(prefix), "find_prefix gives a prefix both pools hold"
        self.window_pool.admit(_WindowTable(seq), window, num_new_tokens)
        super().admit(seq, prefix, num_new_tokens)

    def forkable_blocks(self, parent: Sequence, num_blocks: int) -> int:
        return self.window_pool.forkable_blocks(_WindowTable(parent), num_blocks)

    def fork(self, parent: Sequence, child: Sequence, num_blocks: int) -> None:
        self.window_pool.fork(_WindowTable(parent), _WindowTable(child), num_blocks)
        super().fork(parent, child, num_blocks)

    def cache_computed_blocks(self, seq: Sequence) -> None:
        super().cache_computed_blocks(seq)
        self.window_pool.cache_computed_blocks(_WindowTable(seq))

    def trim(self, seq: Sequence) -> None:
        self.window_pool.trim(_WindowTable(seq))
        super().trim(seq)

    def free(self, seq: Sequence) -> None:
        self.window_pool.free(_WindowTable(seq))
        super().free(seq)


def make_block_manager(
    pools: KVPools,
    block_size: int,
    window: int | None,
    enable_prefix_caching: bool,
    max_model_len: int,
    max_num_batched_tokens: int,
    state_slots: int = 0,
) -> BlockManager:
    """The manager for the runner's KV pools (sizing.kv_pools) and, for a hybrid model, its
    recurrent state slots; raises when the window pool cannot hold one sequence's window and step,
    which would leave it waiting for ever."""
    if state_slots:
        if pools.window_blocks:
            raise ValueError("a hybrid model with recurrent and sliding-window layers is not served")
        if enable_prefix_caching:
            logger.info("prefix caching is off: a recurrent state cannot be reused for a shared prefix")
        return StateBlockManager(pools.full_blocks, block_size, state_slots)
    if not pools.window_blocks:
        return BlockManager(pools.full_blocks, block_size, enable_prefix_caching)
    context_blocks = -(-max_model_len // block_size)
    step = min(max_num_batched_tokens, max_model_len)
    alone = min(context_blocks, window_blocks_needed(window, block_size, 1, step))
    if pools.window_blocks < alone:
        raise ValueError(
            f"the KV cache holds {pools.window_blocks} blocks for the sliding-window layers, but one "
            f"sequence needs {alone} (a window of {window} tokens and a step of {step}); raise "
            "--kv-cache-memory or lower --max-num-batched-tokens"
        )
    if not pools.full_blocks:
        return WindowBlockManager(pools.window_blocks, block_size, window, enable_prefix_caching)
    return HybridBlockManager(
        pools.full_blocks, pools.window_blocks, block_size, window, enable_prefix_caching
    )
