"""The engine end to end on a tiny model: seeds, stop rules, n > 1, logprobs, aborts, admission."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from transformers import AutoModelForCausalLM

from tests.runtime.tiny_models import build_tiny_model

PROMPTS = ["Hello, world! How are", "def add(a, b):", "The quick brown fox", "Once upon a time there"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "smollm", "smollm")


# Every behaviour holds in both step orders: each step's tokens read before the next is scheduled
# (the CPU's default), and the next step launched first (async scheduling, CUDA's default).
@pytest.fixture(scope="module", params=[False, True], ids=["in-order", "async-scheduling"])
def llm(folder, request):
    return LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_batched_tokens=32,
        async_scheduling=request.param,
    )


def all_free(llm):
    bm = llm.engine.block_manager
    return bm.num_free_blocks == bm.num_blocks


def test_seeded_sampling_does_not_depend_on_the_batch(llm):
    params = SamplingParams(temperature=1.5, seed=7, max_tokens=12, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    others = [
        SamplingParams(temperature=1.0, max_tokens=5),
        SamplingParams(temperature=0.7, seed=3, max_tokens=20),
    ]
    batch = llm.generate(PROMPTS[1:3] + [PROMPTS[0]] + PROMPTS[3:], [others[0], others[1], params, others[0]])
    assert batch[2].outputs[0].token_ids == alone
    other_seed = llm.generate(
        PROMPTS[0], SamplingParams(temperature=1.5, seed=8, max_tokens=12, ignore_eos=True)
    )
    assert other_seed[0].outputs[0].token_ids != alone
    assert all_free(llm)


def test_stop_string_spanning_two_tokens_cuts_the_text(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    full = llm.generate(PROMPTS[1], greedy)[0].outputs[0]
    tokenizer = llm.get_tokenizer()
    pieces = [tokenizer.decode(full.token_ids[: i + 1]) for i in range(len(full.token_ids))]
    # The end of the 4th token's text plus the start of the 5th: a string no single token holds.
    boundary = len(pieces[3])
    stop = full.text[boundary - 1 : boundary + 1]
    assert len(stop) == 2 and stop not in pieces[3] and full.text.find(stop) == boundary - 1
    out = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop])
    )
    result = out[0].outputs[0]
    assert result.text == full.text[: boundary - 1]
    assert (result.finish_reason, result.stop_reason) == ("stop", stop)
    kept = llm.generate(
        PROMPTS[1],
        SamplingParams(temperature=0.0, max_tokens=16, stop=[stop], include_stop_str_in_output=True),
    )
    assert kept[0].outputs[0].text == full.text[: boundary + 1]


def test_stop_token_ids_and_min_tokens(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    tokens = llm.generate(PROMPTS[2], greedy)[0].outputs[0].token_ids
    stop_id = next(t for i, t in enumerate(tokens) if i >= 1 and t not in tokens[:i])
    index = tokens.index(stop_id)
    out = llm.generate(PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_id]))[
        0
    ]
    assert out.outputs[0].token_ids == tokens[: index + 1]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", stop_id)
    held = llm.generate(
        PROMPTS[2],
        SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_id], min_tokens=index + 2),
    )[0]
    assert len(held.outputs[0].token_ids) >= index + 2
    assert stop_id not in held.outputs[0].token_ids[: index + 2]


def test_n_samples_share_the_prompt_blocks(llm):
    engine = llm.engine
    prompt = list(range(3, 43))  # 40 tokens: 10 blocks of 4
    engine.add_request(
        "n4", prompt, SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=6, ignore_eos=True)
    )
    peak, outputs = 0, []
    while engine.has_unfinished():
        outputs += engine.step()
        peak = max(peak, engine.block_manager.num_blocks - engine.block_manager.num_free_blocks)
    final = outputs[-1]
    assert final.finished and len(final.outputs) == 4
    assert all(len(o.token_ids) == 6 and o.finish_reason == "length" for o in final.outputs)
    assert len({tuple(o.token_ids) for o in final.outputs}) > 1
    assert peak < 4 * 10
    assert all_free(llm)


def test_delta_outputs_carry_the_step_and_the_final_one_the_whole(llm):
    finals = {}
    for kind in ("cumulative", "delta"):
        params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True, output_kind=kind)
        llm.engine.add_request(kind, PROMPTS[2], params)
        outputs = []
        while llm.engine.has_unfinished():
            outputs += llm.engine.step()
        *running, finals[kind] = outputs
        if kind == "delta":
            assert running and all(o.outputs == [] for o in running)
            streamed = {0: [], 1: []}
            for o in outputs:
                for d in o.delta:
                    streamed[d.index] += d.token_ids
            assert [streamed[o.index] for o in finals[kind].outputs] == [
                o.token_ids for o in finals[kind].outputs
            ]
        else:
            assert all(len(o.outputs) == 2 for o in running)
    assert finals["delta"].outputs == finals["cumulative"].outputs
    with pytest.raises(ValueError, match="output_kind must be one of cumulative, delta, got 'final'"):
        SamplingParams(output_kind="final")


def test_logprobs_match_transformers(llm, folder):
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=1, logprobs=3))[0]
    with torch.inference_mode():
        logits = reference(torch.tensor([out.prompt_token_ids])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1).topk(3)
    got = out.outputs[0].logprobs[0]
    assert list(got)[:1] == [out.outputs[0].token_ids[0]] == [int(expected.indices[0])]
    assert set(got) == set(expected.indices.tolist())
    for token, value in zip(expected.indices.tolist(), expected.values.tolist(), strict=True):
        assert got[token] == pytest.approx(value, abs=1e-4)


def test_abort_frees_blocks_and_ends_with_abort(llm):
    engine = llm.engine
    engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("b", PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    engine.step()
    used = engine.block_manager.num_free_blocks
    aborted = engine.abort("a")
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert engine.block_manager.num_free_blocks > used
    while engine.has_unfinished():
        engine.step()
    assert all_free(llm)


def test_requests_that_can_never_fit_are_refused(llm):
    limit = llm.engine.max_model_len
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([1] * (limit - 5), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], SamplingParams())
    assert not llm.engine.has_unfinished()


def test_timings_are_recorded_in_order(llm):
    metrics = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4))[0].metrics
    assert (
        metrics.arrival_time
        <= metrics.first_scheduled_time
        <= metrics.first_token_time
        <= metrics.last_token_time
        <= metrics.finished_time
    )


def test_gpu_memory_utilization_is_refused_on_the_cpu_by_name(folder):
    with pytest.raises(ValueError, match="--gpu-memory-utilization 0.5 needs a GPU"):
        LLM(str(folder), dtype="float32", device="cpu", gpu_memory_utilization=0.5)


def test_token_ids_outside_the_vocabulary_are_refused_by_field(llm):
    vocab = llm.engine.model_config.architecture.vocab_size
    with pytest.raises(ValueError, match=f"outside the model's vocabulary of {vocab}") as refused:
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=2, min_tokens=1, stop_token_ids=[3, vocab]))
    assert refused.value.param == "stop_token_ids"
    with pytest.raises(ValueError, match="Prompt token id -1") as refused:
        llm.generate([[1, -1]], SamplingParams(max_tokens=2))
    assert refused.value.param == "prompt"
    assert not llm.engine.has_unfinished()
