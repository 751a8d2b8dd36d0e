"""Async scheduling: each step is scheduled and launched before the host reads the tokens of the
step before it, whose input ids it takes from the device; nothing a user sees changes but when it
arrives, and a sequence that stops costs at most one token that is dropped."""

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.request_state import Request
from pagoda_runtime.engine.structured_outputs import StructuredOutputs
from pagoda_runtime.executor.model_runner import LaunchedStep

from tests.runtime.tiny_models import build_tiny_model

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox", "Once upon a time there"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")


def make(folder, overlapped: bool) -> LLM:
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, async_scheduling=overlapped)


def record_order(llm: LLM, monkeypatch) -> list[str]:
    """What the engine does, in order: launch N, sample N (when held back), read N (its tokens
    read from the device), text of N (its text made)."""
    events: list[str] = []
    launched = {}
    runner = llm.engine.runner
    launch, sample, wait, append_text = runner.launch, runner.sample, LaunchedStep.wait, Request.append_text

    def recording_launch(batch, in_flight):
        step = launch(batch, in_flight)
        launched[id(step)] = len(launched) + 1
        events.append(f"launch {launched[id(step)]}")
        return step

    def recording_sample(step):
        if id(step) in launched:  # not the sampling the launch itself queues
            events.append(f"sample {launched[id(step)]}")
        return sample(step)

    def recording_wait(step):
        events.append(f"read {launched[id(step)]}")
        return wait(step)

    def recording_text(request, sampled):
        label = "text of " + [e for e in events if e.startswith("read")][-1].split()[-1]
        if label not in events:
            events.append(label)
        return append_text(request, sampled)

    monkeypatch.setattr(runner, "launch", recording_launch)
    monkeypatch.setattr(runner, "sample", recording_sample)
    monkeypatch.setattr(LaunchedStep, "wait", recording_wait)
    monkeypatch.setattr(Request, "append_text", recording_text)
    return events


def test_the_next_step_is_launched_before_the_tokens_of_the_last_are_read(folder, monkeypatch):
    llm = make(folder, overlapped=True)
    events = record_order(llm, monkeypatch)
    outputs = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 3
    # Step 2 is launched before step 1's tokens are read; after its third token is sampled the
    # sequence is not scheduled again (max_tokens is known at launch): no token is wasted.
    assert events == [
        "launch 1",
        "launch 2",
        "read 1",
        "text of 1",
        "launch 3",
        "read 2",
        "text of 2",
        "read 3",
        "text of 3",
    ]
    timing = llm.engine.last_step_timing
    assert timing.overlapped and timing.host_s > 0


def test_in_order_each_step_is_read_before_the_next_launch(folder, monkeypatch):
    llm = make(folder, overlapped=False)
    events = record_order(llm, monkeypatch)
    llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert events == ["launch 1", "read 1", "text of 1", "launch 2", "read 2", "text of 2"]
    assert not llm.engine.last_step_timing.overlapped


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(
            temperature=0.0, max_tokens=4, structured_outputs=StructuredOutputs(regex="[a-z ]{3,20}")
        ),
    ],
    ids=["penalties", "grammar"],
)
def test_sampling_that_reads_the_previous_tokens_waits_for_them_but_not_the_forward(
    folder, monkeypatch, params
):
    llm = make(folder, overlapped=True)
    events = record_order(llm, monkeypatch)
    llm.generate(PROMPTS[1], params)
    # Step 2's forward is queued first; its sampling once step 1's tokens are appended.
    assert events[:6] == ["launch 1", "launch 2", "read 1", "sample 2", "text of 1", "launch 3"]


def test_a_stopped_sequence_computes_at_most_one_dropped_token(folder, monkeypatch):
    in_order = make(folder, overlapped=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = in_order.generate(PROMPTS[1], greedy)[0].outputs[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    llm = make(folder, overlapped=True)
    sampled_rows = []
    launch = llm.engine.runner.launch

    def counting(batch, in_flight):
        step = launch(batch, in_flight)
        sampled_rows.append(len(step.rows))
        return step

    monkeypatch.setattr(llm.engine.runner, "launch", counting)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    [out] = llm.generate(PROMPTS[1], params)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.outputs[0].token_ids == in_order.generate(PROMPTS[1], params)[0].outputs[0].token_ids
    # Every token the output holds, and one more: launched before the stop string was read.
    assert sum(sampled_rows) == len(out.outputs[0].token_ids) + 1
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_outputs_are_the_same_in_both_orders(folder):
    sync, overlapped = make(folder, overlapped=False), make(folder, overlapped=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = sync.generate(PROMPTS[1], greedy)[0].outputs[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    # The token that completes the stop string is also the last max_tokens allows.
    stop_token = next(
        i for i in range(len(full.token_ids)) if stop in sync.get_tokenizer().decode(full.token_ids[: i + 1])
    )
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0.0, max_tokens=stop_token + 1, ignore_eos=True, stop=[stop]),
        SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=9, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=9, max_tokens=10, repetition_penalty=1.3, min_tokens=4),
    ]
    prompts = [PROMPTS[1], PROMPTS[1], PROMPTS[2], PROMPTS[3]]
    expected, got = sync.generate(prompts, params), overlapped.generate(prompts, params)
    for mine, theirs in zip(got, expected, strict=True):
        for a, b in zip(mine.outputs, theirs.outputs, strict=True):
            assert (a.text, a.token_ids, a.finish_reason, a.stop_reason) == (
                b.text,
                b.token_ids,
                b.finish_reason,
                b.stop_reason,
            )
            # A stop string's extra token changes one step's batch, and float sums with it.
            assert (a.logprobs is None) == (b.logprobs is None)
            for step_a, step_b in zip(a.logprobs or [], b.logprobs or [], strict=True):
                assert step_a == pytest.approx(step_b, abs=1e-5)
    assert [(o.finish_reason, o.stop_reason) for o in expected[1].outputs] == [("stop", stop)]
    for llm in (sync, overlapped):
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks


def test_preemption_prefix_caching_and_chunked_prefill_give_the_in_order_outputs(folder):
    """A cache too small for the batch: sequences are preempted, some with a token in flight, and
    recomputed; prompts arrive in chunks beside decodes and share cached blocks."""
    block_bytes = make(folder, overlapped=False).engine.runner.kv_bytes_per_block

    def small(overlapped: bool) -> LLM:
        return LLM(
            str(folder),
            dtype="float32",
            device="cpu",
            block_size=4,
            kv_cache_memory=40 * block_bytes,
            max_num_batched_tokens=16,
            async_scheduling=overlapped,
        )

    shared = "Once upon a time there was a fox. "
    prompts = [shared + p for p in PROMPTS] * 2
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=2, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=28, min_tokens=10, frequency_penalty=0.4),
        SamplingParams(temperature=0.0, max_tokens=26, ignore_eos=True, stop_token_ids=[7, 11]),
    ] * 2
    in_order, overlapped = small(False), small(True)
    expected, got = in_order.generate(prompts, params), overlapped.generate(prompts, params)
    for mine, theirs in zip(got, expected, strict=True):
        assert [(o.token_ids, o.finish_reason) for o in mine.outputs] == [
            (o.token_ids, o.finish_reason) for o in theirs.outputs
        ]
    stats = overlapped.engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    bm = overlapped.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
