"""Iteration-level continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget. Running sequences go first, oldest first: a decoding sequence
costs one token, one still in its prompt costs the next chunk that fits. Waiting sequences are
then admitted first-come-first-served while the budget, `max_num_seqs` and free blocks allow.
A running sequence whose last token is still on the device (async scheduling) costs nothing: it
only waits for the host to read it. When a running sequence needs a block and none is free, the
newest running sequence is preempted:
its blocks are freed and it waits at the front of the queue to be recomputed later. The oldest
sequence can therefore always take every block, and admission refuses any request that could not
run alone, so the scheduler never deadlocks and never drops a request. Plain Python, no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # per sequence, tokens computed this step

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether sequence i's last token is computed this step, so a new token is sampled for it."""
        seq = self.seqs[i]
        return seq.num_computed_tokens + self.num_new_tokens[i] == seq.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # cumulative

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        seqs, new_tokens = batch.seqs, batch.num_new_tokens
        budget = self.max_num_batched_tokens
        preempted = False
        bm = self.block_manager
        block_size = bm.block_size
        running = SequenceStatus.RUNNING
        # Once per running sequence per step, so kept to plain arithmetic: a decode step needs a new
        # block only when its token starts one.
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not running or seq.last_token_sampled:
                continue  # preempted earlier in this loop, or its last token is being sampled
            computed = seq.num_computed_tokens
            num_new = min(seq.num_tokens - computed, budget)
            if -(-(computed + num_new) // block_size) > len(seq.block_table):
                while not bm.can_append(seq, num_new):
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status is not running:
                    continue
                bm.append(seq, num_new)
            seqs.append(seq)
            new_tokens.append(num_new)
            budget -= num_new
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq, budget):
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _admit(self, seq: Sequence, budget: int) -> bool:
        """Give a waiting sequence its blocks: forked from its leader's prompt, found in the prefix
        cache, or new. False when it has to keep waiting."""
        if seq.num_pending:
            # Preempted while its last token was in flight: its prefill needs that token, which the
            # host reads before the next schedule.
            return False
        bm = self.block_manager
        leader = seq.leader
        if seq is not leader and seq.num_output_tokens == 0:
            if leader.status == SequenceStatus.WAITING or (
                leader.status == SequenceStatus.RUNNING and leader.num_computed_tokens < seq.num_prompt_tokens
            ):
                return False  # its prompt is being computed right now: share it once it is there
            if leader.status == SequenceStatus.RUNNING:
                # The last prompt token is recomputed, partial block included: it yields this
                # sample's own first logits, and the leader keeps sole ownership of its partial block.
                shared = bm.forkable_blocks(leader, (seq.num_prompt_tokens - 1) // bm.block_size)
                remaining = seq.num_tokens - shared * bm.block_size
                if not bm.can_admit(seq, [], min(remaining, budget)):
                    return False
                bm.fork(leader, seq, shared)
                bm.append(seq, min(remaining, budget))
                return True
        prefix = bm.find_prefix(seq)
        num_new = min(seq.num_tokens - len(prefix) * bm.block_size, budget)
        if not bm.can_admit(seq, prefix, num_new):
            return False
        bm.admit(seq, prefix, num_new)
        if seq.num_preemptions == 0 and seq.num_output_tokens == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, batch: ScheduledBatch) -> None:
        """Record that the batch is launched: its tokens are in the cache for every later step (the
        device runs steps in order), and each sequence that samples has one more token, pending
        until the host reads it."""
        cache_blocks = self.block_manager.cache_computed_blocks
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            if batch.samples(i):
                seq.num_pending += 1
            seq.num_computed_tokens += num_new
            cache_blocks(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (stopped, length or aborted) and free its blocks at once."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
