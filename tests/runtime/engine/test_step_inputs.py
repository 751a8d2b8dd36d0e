"""The model runner's step tensors, built with numpy in one pass over the batch, hold what a plain
token-by-token construction holds: for chunked prefills, decodes, forks, prefix-cache hits and,
with async scheduling, tokens still on the device; decode batches padded to a CUDA graph's size."""

import itertools

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.executor.model_runner import graph_batch_sizes

from tests.runtime.tiny_models import build_tiny_model

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox", "Once upon a time there"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")


def token_by_token(batch, in_flight) -> dict[str, list]:
    """The step's inputs the slow, obvious way; a token not read yet is the in-flight step's sample."""
    bs = 4
    pending = {}
    if in_flight is not None and in_flight.samples is not None:
        tokens = in_flight.samples.tokens.tolist()
        pending = {in_flight.batch.seqs[i].seq_id: tokens[k] for k, i in enumerate(in_flight.rows)}
    ids, positions, slots, query_start, seq_lens, rows = [], [], [], [0], [], []
    for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        for p in range(start, start + num_new):
            ids.append(seq.token_ids[p] if p < len(seq.token_ids) else pending[seq.seq_id])
            positions.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
        query_start.append(query_start[-1] + num_new)
        seq_lens.append(start + num_new)
        if start + num_new == seq.num_tokens:
            rows.append(query_start[-1] - 1)
    width = max(len(seq.block_table) for seq in batch.seqs)
    tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in batch.seqs]
    return {
        "input_ids": ids,
        "positions": positions,
        "slot_mapping": slots,
        "query_start_loc": query_start,
        "seq_lens": seq_lens,
        "block_tables": tables,
        "logits_rows": rows,
    }


@pytest.mark.parametrize("overlapped", [False, True], ids=["in-order", "async-scheduling"])
def test_the_vectorized_step_inputs_equal_the_token_by_token_ones(folder, overlapped):
    llm = LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_batched_tokens=12,  # prompts arrive in chunks next to decodes
        async_scheduling=overlapped,
    )
    runner = llm.engine.runner
    prepare, checked = runner._prepare, []

    def compared(batch, in_flight, every_logit=False, prompt_logprobs=False):
        expected = token_by_token(batch, in_flight)
        step, launched = prepare(batch, in_flight, every_logit, prompt_logprobs)
        meta = step.meta
        got = {
            "input_ids": step.input_ids,
            "positions": step.positions,
            "slot_mapping": meta.slot_mapping,
            "query_start_loc": meta.query_start_loc,
            "seq_lens": meta.seq_lens,
            "block_tables": meta.block_tables,
            "logits_rows": step.logits_rows,
        }
        assert {k: v.tolist() for k, v in got.items()} == expected
        assert (meta.max_query_len, meta.max_seq_len) == (
            max(batch.num_new_tokens),
            max(expected["seq_lens"]),
        )
        checked.append(sum(1 for seq in batch.seqs if seq.num_pending))
        return step, launched

    runner._prepare = compared
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    ]
    llm.generate(PROMPTS, params)
    llm.generate(PROMPTS[:2], params[:2])  # again: prefix-cache hits
    assert len(checked) > 10
    # With async scheduling most steps read a token still on the device; in order none does.
    assert (sum(checked) > 0) == overlapped


def test_a_decode_batch_is_padded_to_its_graphs_size(folder):
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4)
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    engine.step()  # the prompts
    runner = engine.runner
    # Pretend graphs of sizes 1, 2 and 4 were captured (a CPU captures none) and build the next step.
    runner._graph_sizes, runner._max_graph_size = [1, 2, 4], 4
    batch = engine.scheduler.schedule()
    step, launched = runner._prepare(batch, None)
    real = token_by_token(batch, None)
    meta = step.meta
    assert step.replayable and meta.num_seqs == 4 and launched.rows == [0, 1, 2]
    assert step.input_ids.tolist() == real["input_ids"] + [0]
    assert meta.slot_mapping.tolist() == real["slot_mapping"] + [-1]  # the padding writes nowhere
    assert meta.seq_lens.tolist() == real["seq_lens"] + [1]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert meta.block_tables.tolist() == real["block_tables"] + [[0] * meta.block_tables.shape[1]]
    assert step.logits_rows.tolist() == [0, 1, 2]  # only the real rows are sampled
    assert torch.equal(step.positions[:3], torch.tensor(real["positions"]))


def test_graph_sizes_step_by_8_then_by_16():
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(256)
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-3:] == [224, 240, 256]
    assert all(b - a == 8 for a, b in itertools.pairwise(sizes[3:]) if b <= 128)
    assert all(b - a == 16 for a, b in itertools.pairwise(sizes) if a >= 128)
    assert graph_batch_sizes(200)[-2:] == [192, 200]


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
COPYING = ["a b c d e f a b c d e f a b c", "one two three one two three one", "x y z x y z x y"]


def _pretend_short_graphs(runner) -> list:
    """Short-step graphs of sizes 1, 2 and 4 at 1 + 4 tokens a sequence, "replayed" eagerly on the
    padded inputs a graph would get (a CPU captures none); (size, width, tokens) of each replay."""
    runner._short_sizes, runner._short_width = [1, 2, 4], 5
    replayed = []

    def replay(step):
        replayed.append((step.meta.num_seqs, step.meta.max_query_len, step.input_ids.shape[0]))
        hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        logits = runner.model.compute_logits(hidden)[step.logits_rows]
        return logits, logits.argmax(dim=-1)

    runner._replay = replay
    return replayed


def test_verify_steps_padded_to_their_graphs_keep_the_greedy_tokens(folder):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(str(folder), dtype="float32", device="cpu", block_size=4).generate(COPYING, greedy)
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, speculative_config=NGRAM)
    runner = llm.engine.runner
    replayed = _pretend_short_graphs(runner)
    prepare, padded = runner._prepare, []

    def recorded(batch, in_flight, every_logit=False, prompt_logprobs=False):
        expected = {}  # each sequence's tokens this step: its last known ones, then its draft
        for i, seq in enumerate(batch.seqs):
            start = seq.num_computed_tokens
            tokens = seq.token_ids[start : start + batch.num_new_tokens[i]] + batch.drafts.get(i, [])
            expected[i] = (start, tokens[: batch.num_new_tokens[i]])
        step, launched = prepare(batch, in_flight, every_logit, prompt_logprobs)
        if step.replayable and step.meta.max_query_len > 1:
            padded.append((expected, step))
        return step, launched

    runner._prepare = recorded
    got = llm.generate(COPYING, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.stats().spec_decode.num_accepted_tokens > 0
    assert padded and {(size, width) for size, width, _ in replayed} <= {(1, 5), (2, 5), (4, 5)}
    for expected, step in padded:
        meta, size = step.meta, step.meta.num_seqs
        starts = meta.query_start_loc.tolist()
        count = starts[len(expected)]
        # The real tokens packed at their positions; the padding after them, in no sequence, writing
        # nowhere; padding sequences without tokens.
        for i, (start, tokens) in expected.items():
            assert step.input_ids[starts[i] : starts[i + 1]].tolist() == tokens
            assert step.positions[starts[i] : starts[i + 1]].tolist() == list(
                range(start, start + len(tokens))
            )
            assert int(meta.seq_lens[i]) == start + len(tokens)
        assert starts[len(expected) :] == [count] * (size + 1 - len(expected))
        assert step.input_ids.shape[0] == size * 5 and (meta.slot_mapping[count:] == -1).all()


def test_a_draft_models_catch_up_steps_padded_to_their_graphs_keep_the_greedy_tokens(folder, tmp_path):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(str(folder), dtype="float32", device="cpu", block_size=4).generate(COPYING, greedy)
    near = build_tiny_model(tmp_path / "near", "smollm", overrides={"rms_norm_eps": 0.01})
    draft = {"model": str(near), "num_speculative_tokens": 4}
    llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, speculative_config=draft)
    target_replays = _pretend_short_graphs(llm.engine.runner)
    draft_replays = _pretend_short_graphs(llm.engine.scheduler.proposer.runner)
    got = llm.generate(COPYING, greedy)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    # The draft caught up on the target's tokens in short steps; the target verified in them.
    assert draft_replays and target_replays
    assert llm.engine.stats().spec_decode.num_accepted_tokens > 0
