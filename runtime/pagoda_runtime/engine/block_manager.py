"""The KV-cache block pool: block tables, reference counts and the prefix cache.

A full block is identified by a chained hash of (its parent's hash, its token ids), so equal
prefixes map to equal hashes whatever follows them; the chain of a request with a LoRA adapter
starts from the adapter's id, as its keys and values differ from the base model's, and so does one
of a sequence with a `cache_salt` (a request's, vLLM's field: only requests with the same salt share
blocks; or a speculative proposer's, whose KV depends on more than its own tokens,
engine/draft_model_proposer.py). Blocks shared
by several sequences carry a reference count; a block whose count drops to zero keeps its contents
and its hash, and sits in a least-recently-freed queue until either a new prefix hits it or the
pool needs it back.
Plain Python: no torch, so it can be read and tested alone.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pagoda_runtime.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


def _chain_root(seq: Sequence) -> int | None:
    lora = seq.group.lora
    key = (None if lora is None else lora.lora_int_id, seq.cache_salt)
    return None if key == (None, None) else hash(("root", *key))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks without a hash are handed out first; hashed ones are evicted oldest first.
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._by_hash: dict[int, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up, cumulative
        self.prefix_hits = 0  # of those, found in the cache

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` the blocks for its next `num_new_tokens` tokens."""
        seq.block_table.extend(self._pop_free() for _ in range(self.blocks_needed(seq, num_new_tokens)))

    # ---- admission with prefix caching -------------------------------------------------------

    def find_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding this sequence's leading full blocks. At least one token is left
        uncached, because the step that computes it also yields the logits to sample from."""
        if not self.enable_prefix_caching:
            return []
        self._extend_hashes(seq, (seq.num_tokens - 1) // self.block_size)
        hits = []
        for i, h in enumerate(seq.block_hashes[: (seq.num_tokens - 1) // self.block_size]):
            block_id = self._by_hash.get(h)
            start = i * self.block_size
            if block_id is None or self.blocks[block_id].token_ids != tuple(
                seq.token_ids[start : start + self.block_size]
            ):
                break
            hits.append(block_id)
        return hits

    def can_admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> bool:
        """Whether `seq`, holding no blocks, can take `prefix` and then run `num_new_tokens` more."""
        reclaimed = sum(1 for b in prefix if self.blocks[b].ref_count == 0)
        total = -(-(len(prefix) * self.block_size + num_new_tokens) // self.block_size)
        return total - len(prefix) + reclaimed <= self.num_free_blocks

    def admit(self, seq: Sequence, prefix: list[int], num_new_tokens: int) -> None:
        assert not seq.block_table, "a sequence is admitted only while it holds no blocks"
        for block_id in prefix:
            self._take(block_id)
        seq.block_table = list(prefix)
        seq.num_computed_tokens = len(prefix) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed_tokens
        self.append(seq, num_new_tokens)

    def forkable_blocks(self, parent: Sequence, num_blocks: int) -> int:
        """How many of the parent's first `num_blocks` blocks a child can share (all of them here; a
        sliding-window pool may have handed some back)."""
        return num_blocks

    def fork(self, parent: Sequence, child: Sequence, num_blocks: int) -> None:
        """Share the parent's first `num_blocks` (full, already computed) blocks with `child`."""
        assert not child.block_table and num_blocks * self.block_size <= parent.num_computed_tokens
        for block_id in parent.block_table[:num_blocks]:
            self._take(block_id)
        child.block_table = parent.block_table[:num_blocks]
        child.block_hashes = parent.block_hashes[:num_blocks]
        child.num_computed_tokens = num_blocks * self.block_size

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Publish the blocks of `seq` that are full and computed, so later prompts can reuse them.
        A block holding a token the host has not read yet (async scheduling) waits for a later
        step: its hash needs the token."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        # Back from the last full block to the last published one: blocks fill up in order, so a
        # decode step looks at one block, not at all of them.
        first = num_full
        while first > 0 and self.blocks[seq.block_table[first - 1]].hash is None:
            first -= 1
        if first == num_full:
            return
        self._extend_hashes(seq, num_full)
        for i in range(first, num_full):
            self._publish(seq, i)

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past `seq`'s computed tokens: those a verify step took for draft
        tokens the target rejected (never published: their tokens were not the sequence's)."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]

    def free(self, seq: Sequence) -> None:
        # Released tail first, so that eviction takes the ends of prefixes before their starts.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    # ---- internals ---------------------------------------------------------------------------

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            # A request's adapter roots its chain: two adapters never share KV blocks.
            parent = seq.block_hashes[-1] if seq.block_hashes else _chain_root(seq)
            seq.block_hashes.append(chain_hash(parent, tuple(seq.token_ids[i * bs : (i + 1) * bs])))

    def _publish(self, seq: Sequence, i: int) -> None:
        """Enter block i of `seq` (full and computed) in the prefix cache."""
        block = self.blocks[seq.block_table[i]]
        if block.hash is not None:
            return
        h = seq.block_hashes[i]
        if h in self._by_hash:
            return  # computed twice concurrently; the first copy stays the shared one
        start = i * self.block_size
        block.hash, block.token_ids = h, tuple(seq.token_ids[start : start + self.block_size])
        self._by_hash[h] = block.block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed more often than taken"
        if block.ref_count == 0:
            if block.hash is None:
                self._free_plain.append(block_id)
            else:
                self._free_cached[block_id] = None

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._free_cached.pop(block_id)
        block.ref_count += 1

    def _pop_free(self) -> int:
        if self._free_plain:
            block_id = self._free_plain.pop()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            block = self.blocks[block_id]
            del self._by_hash[block.hash]
            block.hash, block.token_ids = None, ()
        self.blocks[block_id].ref_count = 1
        return block_id
