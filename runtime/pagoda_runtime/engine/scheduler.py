"""Iteration-level continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget. Running sequences go first, oldest first: a decoding sequence
costs one token, one still in its prompt costs the next chunk that fits. Waiting sequences are
then admitted first-come-first-served while the budget, `max_num_seqs` and free blocks allow.
When a running sequence needs a block and none is free, the newest running sequence is preempted:
its blocks are freed and it waits at the front of the queue to be recomputed later. The oldest
sequence can therefore always take every block, and admission refuses any request that could not
run alone, so the scheduler never deadlocks and never drops a request. Plain Python, no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sequence import Sequence, SequenceStatus
from pagoda_runtime.engine.stats import StepShape


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

    def shape(self) -> StepShape:
        """What this batch computes (before the scheduler counts its tokens as computed); one pass
        of integer sums, cheap enough for every step."""
        context = pairs = sampled = 0
        for seq, new in zip(self.seqs, self.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            context += start + new
            # Query i of the chunk sees the start tokens before it, itself and the chunk's earlier ones.
            pairs += new * start + new * (new + 1) // 2
            sampled += start + new == seq.num_tokens
        return StepShape(sum(self.num_new_tokens), sampled, context, pairs)


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
        budget = self.max_num_batched_tokens
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.can_append(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            self.block_manager.append(seq, num_new)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
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
        """Record that the batch ran: its tokens are now in the cache."""
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.is_finished:
                continue  # ended while the batch ran: its blocks are free already
            seq.num_computed_tokens += num_new
            self.block_manager.cache_computed_blocks(seq)

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
