"""scoring.score: next-token logits at every position from one prefill of the engine's own model."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.scoring import score
from transformers import AutoModelForCausalLM

from tests.runtime.tiny_models import build_tiny_model

TEXT = "Once upon a time there was a little model that learned to talk. The quick brown fox"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "gqa", "gqa")


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, kv_cache_memory=2**22)


def test_score_gives_transformers_logits_at_every_position(llm, folder):
    ids = llm.get_tokenizer().encode(TEXT)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0].float()
    logits = score(llm.engine, ids)
    assert logits.shape == (len(ids), reference.config.vocab_size) and logits.dtype == torch.float32
    assert torch.allclose(logits, expected, rtol=0, atol=1e-4)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_scoring_between_steps_leaves_running_requests_unchanged(llm):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate("def add(a, b):", params)[0].outputs[0].token_ids
    engine = llm.engine
    engine.add_request("running", "def add(a, b):", params)
    outputs = engine.step() + engine.step()
    held = engine.block_manager.num_free_blocks
    score(engine, llm.get_tokenizer().encode(TEXT))
    assert engine.block_manager.num_free_blocks == held
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[-1].finished and outputs[-1].outputs[0].token_ids == alone


def test_texts_that_cannot_be_scored_are_refused(llm):
    with pytest.raises(ValueError, match="nothing to score"):
        score(llm.engine, [])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        score(llm.engine, [1, 10**6])
    with pytest.raises(ValueError, match="exceed max_model_len"):
        score(llm.engine, [1] * (llm.engine.max_model_len + 1))
