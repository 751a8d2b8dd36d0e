"""Sequence classifiers and scoring under --runner pooling: a *ForSequenceClassification checkpoint's
probabilities are transformers' (softmax over its labels, the sigmoid of one); a causal model made a
cross-encoder by classifier_from_token scores a pair as its last token's logits say; an embedding
model scores a pair by the cosine of the two embeddings; what a model cannot do is refused in one
sentence."""

from __future__ import annotations

import shutil

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.pair_scores import PairsError, cosine
from pagoda_runtime.engine.request_validation import RequestRejected
from pagoda_runtime.loading.model_source import ModelLoadError
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from tests.runtime.engine.test_embeddings import sentence_transformers_folder
from tests.runtime.tiny_models import build_tiny_model

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Horses eat hay.", "1"]
ENGINE = dict(dtype="float32", device="cpu", runner="pooling", block_size=4, max_num_batched_tokens=16)


def classifier_folder(tmp_path, labels: int, variant: str = "qwen3"):
    """A tiny causal model's body under a score head transformers draws, saved as transformers
    saves a *ForSequenceClassification checkpoint (no LM head)."""
    causal = build_tiny_model(tmp_path / "causal", variant)
    torch.manual_seed(3)
    model = AutoModelForSequenceClassification.from_pretrained(causal, num_labels=labels, dtype=torch.float32)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 0.5)
    folder = tmp_path / f"classifier-{labels}"
    model.save_pretrained(folder)
    for file in causal.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation")):
            shutil.copy(file, folder / file.name)
    return folder


def transformers_logits(folder, token_ids: list[int]) -> torch.Tensor:
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]


def test_a_sequence_classifiers_probabilities_are_transformers(tmp_path):
    folder = classifier_folder(tmp_path, labels=3)
    llm = LLM(str(folder), **ENGINE)
    outs = llm.classify([QUERY, *DOCUMENTS])
    for out in outs:
        reference = torch.softmax(transformers_logits(folder, out.prompt_token_ids), dim=0)
        torch.testing.assert_close(torch.tensor(out.outputs.probs), reference, rtol=1e-4, atol=1e-5)
    assert {round(sum(out.outputs.probs), 5) for out in outs} == {1.0}
    with pytest.raises(RequestRejected, match="has 3 labels, and scoring needs one"):
        llm.score(QUERY, DOCUMENTS)
    with pytest.raises(RequestRejected, match="sequence classifier .* neither generates text nor embeds"):
        llm.embed(QUERY)
    with pytest.raises(RequestRejected, match="use /score, /rerank or /classify"):
        llm.generate(QUERY, SamplingParams(max_tokens=2))


@pytest.mark.parametrize("variant", ["qwen3", "llama2"])
def test_a_one_label_classifier_scores_each_pair_as_one_prompt(tmp_path, variant):
    """The cross-encoder's pair is the tokenizer's pair encoding (Llama 2's: BOS before each text),
    its score the sigmoid of the one logit: what transformers computes for tokenizer(query, document)."""
    folder = classifier_folder(tmp_path, labels=1, variant=variant)
    llm = LLM(str(folder), **ENGINE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    scores = llm.score(QUERY, DOCUMENTS)
    assert len(scores) == len(DOCUMENTS)
    for document, out in zip(DOCUMENTS, scores, strict=True):
        ids = tokenizer(QUERY, document)["input_ids"]
        assert out.prompt_token_ids == ids
        expected = torch.sigmoid(transformers_logits(folder, ids))[0]
        assert out.outputs.score == pytest.approx(float(expected), abs=1e-5)
    # N against N pairs in order; the same pair scores the same.
    paired = llm.score([QUERY, DOCUMENTS[1]], [DOCUMENTS[0], DOCUMENTS[1]])
    assert paired[0].outputs.score == pytest.approx(scores[0].outputs.score, abs=1e-6)
    assert len(llm.classify(QUERY)[0].outputs.probs) == 1


def test_classifier_from_token_scores_by_the_lm_heads_logits_as_qwen3_reranker(tmp_path):
    """vLLM's recipe for Qwen3-Reranker: the causal checkpoint, declared a classifier whose head is
    the LM head's rows of [false, true]; the score is the true token's two-way softmax at the last
    prompt token."""
    folder = build_tiny_model(tmp_path / "reranker", "qwen3")
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": ["no", "a"],
        "is_original_qwen3_reranker": True,
    }
    llm = LLM(str(folder), hf_overrides=overrides, **ENGINE)
    tokenizer = llm.get_tokenizer()
    false, true = tokenizer.encode("no", False)[0], tokenizer.encode("a", False)[0]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for out in llm.score(QUERY, DOCUMENTS):
        with torch.no_grad():
            logits = model(torch.tensor([out.prompt_token_ids])).logits[0, -1]
        expected = torch.softmax(logits[[false, true]], dim=0)[1]
        assert out.outputs.score == pytest.approx(float(expected), abs=1e-5)
    one = LLM(str(folder), hf_overrides={**overrides, "classifier_from_token": ["a"]}, **ENGINE)
    out = one.classify(QUERY)[0]
    with torch.no_grad():
        logit = model(torch.tensor([out.prompt_token_ids])).logits[0, -1, true]
    assert out.outputs.probs[0] == pytest.approx(float(torch.sigmoid(logit)), abs=1e-5)


def test_an_embedding_model_scores_pairs_by_cosine_similarity(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "MEAN", False)
    llm = LLM(str(folder), **ENGINE)
    texts = [QUERY, *DOCUMENTS]
    vectors = {text: out.outputs.embedding for text, out in zip(texts, llm.embed(texts), strict=True)}
    scores = llm.score(QUERY, DOCUMENTS)
    for document, out in zip(DOCUMENTS, scores, strict=True):
        expected = torch.nn.functional.cosine_similarity(
            torch.tensor(vectors[QUERY]), torch.tensor(vectors[document]), dim=0
        )
        assert out.outputs.score == pytest.approx(float(expected), abs=1e-5)
    assert cosine([1.0, 0.0], [0.0, 0.0]) == 0.0
    with pytest.raises(RequestRejected, match="embeds prompts .* neither generates text nor classifies"):
        llm.classify(QUERY)


def test_what_cannot_be_scored_or_classified_is_refused_in_one_sentence(tmp_path):
    folder = classifier_folder(tmp_path, labels=1)
    with pytest.raises(ModelLoadError, match="is a sequence classifier .* serve it with --runner pooling"):
        LLM(str(folder), dtype="float32", device="cpu")
    with pytest.raises(PairsError, match="text_1 lists 2 texts and text_2 3"):
        LLM(str(folder), **ENGINE).score([QUERY, QUERY], DOCUMENTS)
    with pytest.raises(PairsError, match="text_2 is an empty list"):
        LLM(str(folder), **ENGINE).score(QUERY, [])
    causal = build_tiny_model(tmp_path / "causal-too", "qwen3")
    for tokens, message in (
        (["yes"], "'yes' is 2 tokens to this model's tokenizer"),
        (["no", "a", "b"], "must list one token or two"),
    ):
        with pytest.raises(ModelLoadError, match=message):
            LLM(str(causal), hf_overrides={"classifier_from_token": tokens}, **ENGINE)
    with pytest.raises(ValueError, match="normalize applies to embeddings"):
        LLM(str(folder), pooler_config={"normalize": True}, **ENGINE)


@pytest.mark.slow
def test_scores_and_embeddings_do_not_depend_on_the_tensor_parallel_size(tmp_path):
    """Rank 0 pools the hidden states the split model computes, and applies a classifier's head
    read whole from the checkpoint."""
    for folder in (
        classifier_folder(tmp_path / "cross", labels=1, variant="gqa"),
        sentence_transformers_folder(tmp_path / "bi", "MEAN", True, variant="gqa"),
    ):
        expected = LLM(str(folder), **ENGINE).score(QUERY, DOCUMENTS)
        split = LLM(str(folder), tensor_parallel_size=2, **ENGINE)
        try:
            scores = split.score(QUERY, DOCUMENTS)
        finally:
            split.shutdown()
        assert [s.outputs.score for s in scores] == pytest.approx(
            [s.outputs.score for s in expected], abs=1e-5
        )
