"""Iteration-level continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget. Running sequences go first, oldest first: a decoding sequence
costs one token, one still in its prompt costs the next chunk that fits. Waiting sequences are
then admitted first-come-first-served while the budget, `max_num_seqs` and free blocks allow, and,
with LoRA, while the running sequences use no more than `max_loras` adapters.
A running sequence whose last token is still on the device (async scheduling) costs nothing: it
only waits for the host to read it. When a running sequence needs a block and none is free, the
newest running sequence is preempted:
its blocks are freed and it waits at the front of the queue to be recomputed later. The oldest
sequence can therefore always take every block, and admission refuses any request that could not
run alone, so the scheduler never deadlocks and never drops a request. Plain Python, no torch.

With speculative decoding a decoding sequence may carry a draft (ngram_proposer.py,
draft_model_proposer.py): it costs 1 + the draft's length of the budget, all verified in one step,
and `accept` rolls it back to what the target accepted. Each sequence's draft length adapts to its
acceptance (draft_length.py), and no sequence drafts in a step while more than the config's
disable_by_batch_size are running.

Under the priority policy the waiting and the running sequences are both kept in rank order
(engine/priority.py: priority, then arrival, with ageing) instead: "oldest" above reads "best
ranked", a preempted sequence waits at its rank, and the victim of a preemption is the worst-ranked
running sequence. A waiting sequence that outranks the worst running one also preempts it when it
could not start beside it (no free slot of max_num_seqs, or too few free blocks for its first
chunk), so a high-priority request never waits for a low-priority one to finish.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.draft_length import DraftLengths
from pagoda_runtime.engine.priority import rank
from pagoda_runtime.engine.sequence import Sequence, SequenceStatus


class Proposer(Protocol):
    """What drafts tokens for speculative decoding (ngram_proposer.py, draft_model_proposer.py)."""

    config: SpeculativeConfig

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[tuple[list[int], Any]]:
        """Per decoding sequence, up to its limit of draft tokens and the distributions q
        [len(draft), vocab] they were drawn from (None: point masses)."""

    def free(self, seq: Sequence) -> None:
        """`seq` stopped running (finished, aborted or preempted): drop what the proposer holds for it."""


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # per sequence, tokens computed this step
    # Index in `seqs` -> the draft tokens that sequence's step verifies after its last token.
    drafts: dict[int, list[int]] = field(default_factory=dict)
    # Index in `seqs` -> the distributions a draft model drew that draft from (absent: point masses).
    draft_probs: dict[int, Any] = field(default_factory=dict)
    # Per sequence, its LoRA adapter's device slot (-1: the base model), set by the engine once the
    # adapters are in slots; None when no sequence has an adapter.
    lora_slots: list[int] | None = None

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether sequence i's last token is computed this step, so a new token is sampled for it."""
        seq = self.seqs[i]
        ends = seq.num_computed_tokens + self.num_new_tokens[i]
        return ends == seq.num_tokens + len(self.drafts.get(i, ()))


def _rank(seq: Sequence) -> tuple[float, int]:
    return rank(seq.group.priority, seq.group.arrival_time), seq.seq_id


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        *,
        proposer: Proposer | None = None,
        policy: str = "fcfs",
        max_loras: int | None = None,
    ) -> None:
        """policy: one of contract.config.SCHEDULING_POLICIES; max_loras: the most LoRA adapters
        running at once (the device's slots), None without LoRA."""
        self.block_manager = block_manager
        self.proposer = proposer  # speculative decoding's, None when off
        self.draft_lengths = (
            None if proposer is None else DraftLengths(proposer.config.num_speculative_tokens)
        )
        self.max_num_seqs = max_num_seqs
        self.max_loras = max_loras
        self.max_num_batched_tokens = max_num_batched_tokens
        self.by_priority = policy == "priority"
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # cumulative

    def add(self, seq: Sequence) -> None:
        if self.by_priority:
            bisect.insort(self.waiting, seq, key=_rank)
        else:
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
        # Kept from the running sequences for the best waiting one when it outranks some of them.
        reserved = self._make_room(budget) if self.by_priority else 0
        budget -= reserved
        drafts = self._propose()
        # Once per running sequence per step, so kept to plain arithmetic: a decode step needs a new
        # block only when its token starts one.
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not running or seq.last_token_sampled:
                continue  # preempted earlier in this loop, or its last token is being sampled
            computed = seq.num_computed_tokens
            num_new = _step_tokens(seq, budget)
            draft, probs = drafts.get(seq.seq_id, ([], None))
            if draft:
                draft = draft[: budget - 1]
                probs = None if probs is None else probs[: len(draft)]
                num_new += len(draft)
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
            if draft:
                batch.drafts[len(seqs)] = draft
                if probs is not None:
                    batch.draft_probs[len(seqs)] = probs
            seqs.append(seq)
            new_tokens.append(num_new)
            budget -= num_new
        budget += reserved
        adapters = self.running_adapters() if self.max_loras is not None else set()
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            lora = seq.group.lora
            if lora is not None and lora.lora_int_id not in adapters and len(adapters) >= self.max_loras:
                break  # every adapter slot is taken by running sequences: wait for one to finish
            if not self._admit(seq, budget):
                break
            if lora is not None:
                adapters.add(lora.lora_int_id)
            self.waiting.popleft()
            if self.by_priority:
                bisect.insort(self.running, seq, key=_rank)
            else:
                self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            num_new = _step_tokens(seq, budget)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _propose(self) -> dict[int, tuple[list[int], Any]]:
        """seq_id -> the draft of each running sequence that decodes this step (cut to the budget
        left when its turn comes); none while more than disable_by_batch_size are running."""
        proposer = self.proposer
        if proposer is None or len(self.running) > proposer.config.disable_by_batch_size:
            return {}
        decoding = [
            seq
            for seq in self.running
            if not seq.last_token_sampled and seq.num_tokens - seq.num_computed_tokens == 1
        ]
        if not decoding:
            return {}
        proposals = proposer.propose(decoding, [self.draft_lengths.limit(seq) for seq in decoding])
        return {seq.seq_id: proposal for seq, proposal in zip(decoding, proposals, strict=True)}

    def running_adapters(self) -> set[int]:
        """The lora_int_ids of the running sequences' adapters."""
        return {seq.group.lora.lora_int_id for seq in self.running if seq.group.lora is not None}

    def _make_room(self, budget: int) -> int:
        """Priority policy: preempt the worst-ranked running sequences while the best waiting one
        outranks them and could not start beside them (its prefix-cache hits are not counted, so
        this may free a little more than it needed). Returns the tokens of the step's budget to keep
        for that sequence's first chunk, so that the prompt chunks of running sequences ranked below
        it do not take the whole budget; every running sequence keeps at least one token."""
        while self.waiting and self.running:
            head, worst = self.waiting[0], self.running[-1]
            if _rank(worst) < _rank(head) or self._must_wait(head):
                return 0
            num_new = min(head.num_tokens - head.num_computed_tokens, budget)
            if len(self.running) < self.max_num_seqs and self.block_manager.can_admit(head, [], num_new):
                return min(num_new, max(0, budget - len(self.running)))
            self._preempt(worst)
        return 0

    def _must_wait(self, seq: Sequence) -> bool:
        """Whether a waiting sequence cannot start now, however much room there is."""
        if seq.num_pending:
            # Preempted while its last token was in flight: its prefill needs that token, which the
            # host reads before the next schedule.
            return True
        leader = seq.leader
        # A sample whose prompt is being computed right now shares it once it is there.
        return (
            seq is not leader
            and seq.num_output_tokens == 0
            and (
                leader.status == SequenceStatus.WAITING
                or (
                    leader.status == SequenceStatus.RUNNING
                    and leader.num_computed_tokens < seq.num_prompt_tokens
                )
            )
        )

    def _admit(self, seq: Sequence, budget: int) -> bool:
        """Give a waiting sequence its blocks: forked from its leader's prompt, found in the prefix
        cache, or new. False when it has to keep waiting."""
        if self._must_wait(seq):
            return False
        bm = self.block_manager
        leader = seq.leader
        if seq is not leader and seq.num_output_tokens == 0 and leader.status == SequenceStatus.RUNNING:
            # The last prompt token is recomputed, partial block included: it yields this
            # sample's own first logits, and the leader keeps sole ownership of its partial block.
            shared = bm.forkable_blocks(leader, (seq.num_prompt_tokens - 1) // bm.block_size)
            remaining = seq.num_tokens - shared * bm.block_size
            if not bm.can_admit(seq, [], min(remaining, budget)):
                return False
            bm.fork(leader, seq, shared)
            bm.append(seq, min(remaining, budget))
            return True
        # A prompt whose logprobs were asked for is computed whole: a cached block yields no logits.
        prefix = bm.find_prefix(seq) if seq.params.prompt_logprobs is None else []
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
        if self.proposer is not None:
            self.proposer.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:
            bisect.insort(self.waiting, seq, key=_rank)
        else:
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

    def accept(self, seq: Sequence, num_draft: int, num_accepted: int) -> None:
        """A verify step's outcome, read by the host: of the `num_draft` tokens drafted and computed
        for `seq`, the first `num_accepted` are its own, and with the target's token after them
        they are pending until appended. The rejected ones' KV slots are rolled back: the
        sequence's computed length, and the blocks past it."""
        seq.num_pending += num_accepted
        seq.num_computed_tokens -= num_draft - num_accepted
        self.block_manager.trim(seq)
        self.draft_lengths.record(seq, num_draft, num_accepted)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (stopped, length or aborted) and free its blocks at once."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        self.block_manager.free(seq)
        if self.proposer is not None:
            self.proposer.free(seq)
            self.draft_lengths.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


# Prompt tokens one step computes of a request with prompt_logprobs: each is a float32 logits row
# of the whole vocabulary (256 x 152k is 156 MB), so a long prompt must not take a whole budget.
PROMPT_LOGPROBS_CHUNK = 256


def _step_tokens(seq: Sequence, budget: int) -> int:
    """The tokens `seq` computes this step, drafts aside: what it has left, within the budget."""
    num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
    # Plain arithmetic for a decode, as the loop over running sequences asks.
    if num_new <= PROMPT_LOGPROBS_CHUNK or seq.params.prompt_logprobs is None:
        return num_new
    return PROMPT_LOGPROBS_CHUNK
