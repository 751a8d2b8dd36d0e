"""EAGLE heads under tensor parallelism (gloo on the CPU, the offline LLM starting its ranks as
`serve` does): every rank holds the whole head and runs its steps as rank 0 sends them, with the
hidden states the head takes per token, since the head embeds with the target's vocabulary-parallel
embedding (and EAGLE-1 computes its logits with the target's LM head), collectives of every rank.
A head trained on the target's hidden states keeps its acceptance under two ranks (so rank 0's
hidden states are the whole ones, not a rank's slice), and the outputs stay the target's."""

import json

import pytest
from pagoda_runtime import LLM

from tests.runtime.engine.test_eagle_speculation import (
    TRAINED_PARAMS,
    all_free,
    outputs,
    training_prompts,
    write_head,
)
from tests.runtime.tiny_models import build_tiny_model

SETTINGS = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle-tp")
    # Four layers: EAGLE-3 reads the hidden states entering layers 2, 4 // 2 and 4 - 3.
    return build_tiny_model(root / "target", "llama3", overrides={"num_hidden_layers": 4})


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_a_trained_head_on_two_ranks_drafts_as_on_one_and_keeps_the_targets_outputs(target, tmp_path, method):
    heads = json.loads((target / "config.json").read_text())["num_key_value_heads"]
    assert heads % 2 == 0  # the target splits over two ranks
    prompts = training_prompts()
    greedy = outputs(LLM(str(target), **SETTINGS), prompts, TRAINED_PARAMS)
    head = write_head(method, target, tmp_path / "head", (prompts, greedy))
    speculative = {"method": method, "model": str(head), "num_speculative_tokens": 2}
    speculative["disable_by_batch_size"] = 64
    rates = []
    for size in (1, 2):
        llm = LLM(str(target), tensor_parallel_size=size, speculative_config=speculative, **SETTINGS)
        try:
            assert outputs(llm, prompts, TRAINED_PARAMS) == greedy
            counts = llm.engine.stats().spec_decode
            rates.append(counts.num_accepted_tokens / counts.num_draft_tokens)
            assert all_free(llm)
            # The whole head on rank 0, as on one GPU.
            assert llm.engine.memory.draft.weight_bytes == llm.engine.memory.draft.predicted_weight_bytes
        finally:
            llm.shutdown()
    assert rates[0] > 0.35 and rates[1] > 0.35, rates
    assert abs(rates[0] - rates[1]) < 0.05, rates
