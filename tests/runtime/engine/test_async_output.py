"""Async output processing: a step's text is made while the next step runs, and nothing a user
sees changes but when it arrives."""

import pytest
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.request_state import Request
from pagoda_runtime.executor.model_runner import LaunchedStep

from tests.runtime.tiny_models import build_tiny_model

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox", "Once upon a time there"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")


def make(folder, async_output: bool) -> LLM:
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, async_output_proc=async_output)


def record_order(llm: LLM, monkeypatch) -> list[str]:
    """What the engine does, in order: launch N, wait N (tokens read), text N (step N's text)."""
    events: list[str] = []
    launched = {}
    launch, wait, append_text = llm.engine.runner.launch, LaunchedStep.wait, Request.append_text

    def recording_launch(batch):
        step = launch(batch)
        launched[id(step)] = len(launched) + 1
        events.append(f"launch {launched[id(step)]}")
        return step

    def recording_wait(step):
        events.append(f"wait {launched[id(step)]}")
        return wait(step)

    def recording_text(request, sampled):
        label = f"text of {len([e for e in events if e.startswith('wait')])}"
        if events[-1] != label:
            events.append(label)
        return append_text(request, sampled)

    monkeypatch.setattr(llm.engine.runner, "launch", recording_launch)
    monkeypatch.setattr(LaunchedStep, "wait", recording_wait)
    monkeypatch.setattr(Request, "append_text", recording_text)
    return events


def test_text_is_made_while_the_next_step_runs(folder, monkeypatch):
    llm = make(folder, async_output=True)
    events = record_order(llm, monkeypatch)
    outputs = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 3
    # Step 2 is launched before step 1's text is made, and its tokens are read only after.
    assert events == [
        "launch 1",
        "wait 1",
        "launch 2",
        "text of 1",
        "wait 2",
        "launch 3",
        "text of 2",
        "wait 3",
        "text of 3",
    ]
    timing = llm.engine.last_step_timing
    assert timing.overlapped_s > 0 and timing.host_s < timing.host_s + timing.overlapped_s


def test_without_it_each_step_makes_its_text_before_the_next_launch(folder, monkeypatch):
    llm = make(folder, async_output=False)
    events = record_order(llm, monkeypatch)
    llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    assert events == ["launch 1", "wait 1", "text of 1", "launch 2", "wait 2", "text of 2"]
    assert llm.engine.last_step_timing.overlapped_s == 0


def test_outputs_are_the_same_in_both_orders(folder):
    sync, overlapped = make(folder, async_output=False), make(folder, async_output=True)
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
