"""A drafted decode step in the scheduler: it costs 1 + K of the budget, takes the blocks its draft
needs, and `accept` rolls the sequence back to what the target accepted, blocks included."""

from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.ngram_proposer import NgramProposer
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import Scheduler
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup

# "1 2 3" repeats: after "... 1 2" the lookup drafts "3 1 2 3".
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def decoding(scheduler):
    """A sequence whose prompt is computed and whose first output token (3) has been read."""
    group = SequenceGroup("r", PROMPT, SamplingParams(max_tokens=20), 0.0)
    group.seqs = [Sequence(group, 0)]
    seq = group.seqs[0]
    scheduler.add(seq)
    scheduler.update(scheduler.schedule())
    seq.append_read_token(3)
    return seq


def test_a_draft_costs_its_tokens_and_a_rejection_gives_its_blocks_back():
    bm = BlockManager(num_blocks=16, block_size=4)
    proposer = NgramProposer(SpeculativeConfig("ngram", 4, 3, 1))
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seq = decoding(scheduler)
    assert (seq.num_computed_tokens, len(seq.block_table)) == (8, 2)
    batch = scheduler.schedule()
    assert batch.drafts == {0: [1, 2, 3, 1]} and batch.num_new_tokens == [5]
    assert len(seq.block_table) == 4 and batch.samples(0)  # positions 8..12 need blocks 2 and 3
    scheduler.update(batch)
    free = bm.num_free_blocks
    scheduler.accept(seq, 4, 1)  # "1" accepted, "2 3 1" rejected; the target's own token pending
    assert seq.num_computed_tokens == 10 and seq.num_pending == 2
    assert len(seq.block_table) == 3 and bm.num_free_blocks == free + 1


def test_the_budget_caps_the_draft():
    bm = BlockManager(num_blocks=16, block_size=4)
    proposer = NgramProposer(SpeculativeConfig("ngram", 4, 3, 1))
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seq = decoding(scheduler)
    scheduler.max_num_batched_tokens = 3
    batch = scheduler.schedule()
    assert batch.drafts == {0: [1, 2]} and batch.num_new_tokens == [3]
    assert seq.num_computed_tokens == 8


def test_the_draft_length_shrinks_on_rejections_and_grows_back_on_full_acceptance():
    bm = BlockManager(num_blocks=32, block_size=4)
    proposer = NgramProposer(SpeculativeConfig("ngram", 4, 3, 1))
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seq = decoding(scheduler)
    limits = []
    # Two verify steps rejecting everything, then two accepting everything; the text stays "1 2 3"
    # repeated, so the lookup always finds more than the limit.
    for accepted_all in (False, False, True, True):
        batch = scheduler.schedule()
        draft = batch.drafts[0]
        limits.append(len(draft))
        scheduler.update(batch)
        kept = len(draft) if accepted_all else 0
        scheduler.accept(seq, len(draft), kept)
        for _ in range(kept + 1):
            seq.append_read_token(PROMPT[len(seq.token_ids) % 3])
    assert limits == [4, 3, 2, 4]


def test_no_sequence_drafts_while_more_than_disable_by_batch_size_run():
    bm = BlockManager(num_blocks=64, block_size=4)
    proposer = NgramProposer(SpeculativeConfig("ngram", 4, 3, 1, disable_by_batch_size=2))
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seqs = []
    for i in range(3):
        group = SequenceGroup(f"r{i}", PROMPT, SamplingParams(max_tokens=20), 0.0)
        group.seqs = [Sequence(group, 0)]
        seqs.append(group.seqs[0])
        scheduler.add(seqs[-1])
    scheduler.update(scheduler.schedule())
    for seq in seqs:
        seq.append_read_token(3)
    batch = scheduler.schedule()
    assert batch.drafts == {} and batch.num_new_tokens == [1, 1, 1]
    scheduler.update(batch)
    for seq in seqs:
        seq.append_read_token(1)
    scheduler.finish(seqs[2], "stop")
    batch = scheduler.schedule()
    assert sorted(batch.drafts) == [0, 1]


class RecordingProposer:
    config = SpeculativeConfig("ngram", 2, 2, 1)

    def __init__(self):
        self.freed = []

    def propose(self, seqs, limits):
        return [([], None)] * len(seqs)

    def free(self, seq):
        self.freed.append(seq.seq_id)


def test_the_proposer_lets_go_of_preempted_and_finished_sequences():
    """A draft model's cache holds a shadow of each sequence: preemption and the end of a sequence
    (stop, length or abort) hand it back at once."""
    bm = BlockManager(num_blocks=4, block_size=4)
    proposer = RecordingProposer()
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=proposer)
    seqs = []
    for i in range(2):
        group = SequenceGroup(f"r{i}", PROMPT, SamplingParams(max_tokens=20), 0.0)
        group.seqs = [Sequence(group, 0)]
        seqs.append(group.seqs[0])
        scheduler.add(seqs[-1])
    scheduler.update(scheduler.schedule())  # both prompts: all four blocks
    for seq in seqs:
        seq.append_read_token(3)
    scheduler.schedule()  # the first needs a fifth block: the second is preempted
    assert proposer.freed == [seqs[1].seq_id]
    scheduler.finish(seqs[0], "abort")
    assert proposer.freed == [seqs[1].seq_id, seqs[0].seq_id]
