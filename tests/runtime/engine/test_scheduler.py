"""The scheduler and block manager driven by a simulated model: a fake KV cache records which token
each slot holds, so every step can check that each sequence's blocks hold exactly its own tokens."""

import random
import subprocess
import sys

import pytest
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import Scheduler
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup, SequenceStatus


def test_scheduler_and_block_manager_import_without_torch():
    code = (
        "import sys, pagoda_runtime.engine.scheduler, pagoda_runtime.engine.block_manager; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class Simulation:
    """overlapped: each step is scheduled before the tokens of the step before are read (async
    scheduling); its input for a token still in flight comes from the simulated device."""

    def __init__(self, num_blocks, block_size, max_num_seqs, budget, prefix_caching=True, overlapped=False):
        self.bm = BlockManager(num_blocks, block_size, prefix_caching)
        self.scheduler = Scheduler(self.bm, max_num_seqs, budget)
        self.budget = budget
        self.overlapped = overlapped
        self.cache: dict[int, tuple[int, int]] = {}  # slot -> (position, token)
        self.groups: list[SequenceGroup] = []
        self.in_flight: dict[Sequence, int] = {}  # sampled on the device, not read yet

    def add(self, prompt, max_tokens, n=1):
        group = SequenceGroup(f"r{len(self.groups)}", prompt, SamplingParams(n=n, max_tokens=max_tokens), 0.0)
        group.seqs = [Sequence(group, i) for i in range(n)]
        self.groups.append(group)
        for seq in group.seqs:
            self.scheduler.add(seq)
        return group

    def on_device(self, seq):
        """Its tokens as the device has them: the pending one included."""
        return seq.token_ids + ([self.in_flight[seq]] if seq.num_pending else [])

    def step(self):
        batch = self.scheduler.schedule()
        assert batch.seqs or self.in_flight, "nothing scheduled while requests are unfinished: a deadlock"
        assert batch.num_tokens <= self.budget
        assert len(self.scheduler.running) <= self.scheduler.max_num_seqs
        bs = self.bm.block_size
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            assert not seq.last_token_sampled, f"{seq} computes a token past max_tokens"
            tokens = self.on_device(seq)
            for pos in range(seq.num_computed_tokens):
                slot = seq.block_table[pos // bs] * bs + pos % bs
                assert self.cache[slot] == (pos, tokens[pos]), f"{seq} reads a wrong key at {pos}"
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new):
                block = seq.block_table[pos // bs]
                assert self.bm.blocks[block].ref_count == 1, "a shared block was written"
                self.cache[block * bs + pos % bs] = (pos, tokens[pos])
        sampling = [seq for i, seq in enumerate(batch.seqs) if batch.samples(i)]
        # A deterministic "model" that differs between samples, so forks diverge.
        sampled = {seq: (sum(self.on_device(seq)[-3:]) * 7 + seq.index) % 50 for seq in sampling}
        self.scheduler.update(batch)
        if self.overlapped:
            self.read(self.in_flight)
            self.in_flight = sampled
        else:
            self.read(sampled)

    def read(self, sampled):
        for seq, token in sampled.items():
            if seq.is_finished:
                continue  # ended while its token was in flight: the token is dropped
            seq.append_read_token(token)
            if seq.last_token_read:
                self.scheduler.finish(seq, "length")

    def run(self, max_steps=10_000):
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished():
                return
            self.step()
        raise AssertionError("did not finish")


def all_free(sim):
    return sim.bm.num_free_blocks == sim.bm.num_blocks and all(b.ref_count == 0 for b in sim.bm.blocks)


@pytest.mark.parametrize("overlapped", [False, True], ids=["in-order", "async-scheduling"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_random_workload_under_memory_pressure_finishes_everything(prefix_caching, overlapped):
    rng = random.Random(0)
    sim = Simulation(24, 4, max_num_seqs=8, budget=16, prefix_caching=prefix_caching, overlapped=overlapped)
    shared = [rng.randrange(50) for _ in range(10)]
    groups = []
    for _ in range(30):
        prompt = (shared if rng.random() < 0.5 else []) + [
            rng.randrange(50) for _ in range(rng.randint(1, 30))
        ]
        groups.append(sim.add(prompt, max_tokens=rng.randint(1, 20), n=rng.choice([1, 1, 2, 3])))
    sim.run()
    assert sim.scheduler.num_preemptions > 0
    for group in groups:
        for seq in group.seqs:
            assert seq.status == SequenceStatus.FINISHED and seq.num_output_tokens == group.params.max_tokens
    assert all_free(sim)
    if prefix_caching:
        assert sim.bm.prefix_hits > 0


def test_decodes_and_a_chunked_prefill_share_the_token_budget():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=8, budget=8)
    for _ in range(3):
        sim.add([1, 2, 3], max_tokens=50)
    sim.step()  # the three short prompts
    sim.add(list(range(40)), max_tokens=5)
    batch = sim.scheduler.schedule()
    assert batch.num_new_tokens == [1, 1, 1, 5]  # three decodes, then a 5-token chunk of the prompt
    assert not batch.samples(3)


def test_first_come_first_served():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=1, budget=64)
    first = sim.add([1, 2], max_tokens=3).seqs[0]
    second = sim.add([3, 4], max_tokens=3).seqs[0]
    sim.step()
    assert first.status == SequenceStatus.RUNNING and second.status == SequenceStatus.WAITING
    sim.run()


def test_abort_frees_blocks_at_once():
    sim = Simulation(num_blocks=16, block_size=4, max_num_seqs=4, budget=64)
    group = sim.add(list(range(20)), max_tokens=10, n=2)
    waiting = sim.add(list(range(5)), max_tokens=10)
    sim.step()
    sim.step()
    for seq in group.seqs + waiting.seqs:
        sim.scheduler.finish(seq, "abort")
    assert all_free(sim) and not sim.scheduler.has_unfinished()


def test_samples_of_one_request_share_the_prompt_blocks():
    sim = Simulation(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, prefix_caching=False)
    group = sim.add(list(range(30)), max_tokens=4, n=4)
    sim.step()
    sim.step()
    used = sim.bm.num_blocks - sim.bm.num_free_blocks
    prompt_blocks = -(-30 // 4)
    assert all(seq.status == SequenceStatus.RUNNING for seq in group.seqs)
    assert used < 4 * prompt_blocks
    assert used == prompt_blocks + 3 * 1  # each extra sample owns only its partial last block
    sim.run()
    assert len({tuple(seq.output_token_ids) for seq in group.seqs}) == 4
    assert all_free(sim)
