"""POST /score, /rerank (and their /v1, /v2 paths) and /classify as vLLM serves them, on engines
started with --runner pooling: a cross-encoder (a classifier of one output) scores each pair as
LLM.score does, an embedding model by cosine similarity; /rerank ranks the documents by that score;
/classify names the likeliest label. What a model or the request cannot do is a 400 naming the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pagoda_runtime import LLM
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.llm_engine import LLMEngine

from tests.runtime.engine.test_classifiers import DOCUMENTS, QUERY, classifier_folder
from tests.runtime.engine.test_embeddings import sentence_transformers_folder

from .conftest import fake_app, wait_ready

ENGINE = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16, runner="pooling")


def _serve(folder, **engine):
    config = EngineConfig(model=str(folder), **ENGINE, **engine)
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)), model=str(folder))
    return TestClient(app)


@pytest.fixture(scope="module", params=["cross-encoder", "bi-encoder"])
def served(request, tmp_path_factory):
    """(HTTP client, the same model offline) for a one-label classifier and an embedding model."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "cross-encoder":
        folder = classifier_folder(tmp, labels=1)
    else:
        folder = sentence_transformers_folder(tmp, "MEAN", True)
    with _serve(folder) as client:
        wait_ready(client, timeout=60)
        yield client, LLM(str(folder), **ENGINE)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_gives_llm_scores_in_pair_order(served, path):
    http, offline = served
    expected = [out.outputs.score for out in offline.score(QUERY, DOCUMENTS)]
    body = http.post(path, json={"text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    pairwise = http.post(path, json={"text_1": [QUERY, QUERY], "text_2": DOCUMENTS[:2]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(expected[:2], abs=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_documents_by_score_and_keeps_the_top_n(served, path):
    http, offline = served
    scores = [out.outputs.score for out in offline.score(QUERY, DOCUMENTS)]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])
    body = http.post(path, json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        sorted(scores, reverse=True), abs=1e-5
    )
    assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in order]
    assert body["usage"]["total_tokens"] > 0 and body["id"].startswith("rerank-")
    top = http.post(
        path, json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": False}
    )
    assert [(r["index"], r.get("document")) for r in top.json()["results"]] == [(i, None) for i in order[:2]]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/score", {"text_1": [QUERY, QUERY], "text_2": DOCUMENTS}, "text_2", "pair one with one"),
        ("/score", {"text_1": [], "text_2": DOCUMENTS}, "text_1", "empty list"),
        ("/score", {"text_1": QUERY, "text_2": ["", "x"]}, "text_2", "holds an empty text"),
        ("/score", {"text_1": QUERY, "text_2": ["x"] * 200}, "text_2", "more than the 128"),
        ("/score", {"text_1": QUERY, "text_2": "x", "encoding_format": "float"}, "encoding_format", "Extra"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents", "empty list"),
        ("/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n", "greater than or equal"),
        ("/rerank", {"query": "x " * 300, "documents": ["y"]}, None, "at most"),
    ],
)
def test_what_cannot_be_scored_is_a_400_naming_the_field(served, path, body, param, message):
    http, _ = served
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"], error
    if param is not None:
        assert error["param"] == param, error
    assert http.get("/health/ready").status_code == 200


def test_classify_names_the_likeliest_label(tmp_path):
    folder = classifier_folder(tmp_path, labels=3)
    offline = LLM(str(folder), **ENGINE)
    expected = [out.outputs.probs for out in offline.classify(DOCUMENTS)]
    with _serve(folder) as http:
        wait_ready(http, timeout=60)
        body = http.post("/classify", json={"input": DOCUMENTS}).json()
        for data, probs in zip(body["data"], expected, strict=True):
            assert data["probs"] == pytest.approx(probs, abs=1e-5) and data["num_classes"] == 3
            assert data["label"] == f"LABEL_{probs.index(max(probs))}"
        refused = http.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        assert refused.status_code == 400 and "has 3 labels" in refused.json()["error"]["message"]
        embed = http.post("/v1/embeddings", json={"input": QUERY})
        assert embed.status_code == 400 and "sequence classifier" in embed.json()["error"]["message"]


def test_classify_on_an_embedding_model_says_what_it_serves(served):
    http, offline = served
    response = http.post("/classify", json={"input": QUERY})
    if offline.engine.pooling_task == "classify":
        assert response.json()["data"][0]["probs"] == pytest.approx(
            [offline.classify(QUERY)[0].outputs.probs[0]], abs=1e-5
        )
        return
    assert response.status_code == 400
    assert "use /v1/embeddings, or /score and /rerank" in response.json()["error"]["message"]


def test_a_generating_engine_refuses_scores_and_classes(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "LAST", True)
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu")
    app, _ = fake_app(AsyncLLMEngine(LLMEngine(config)), model=str(folder))
    with TestClient(app) as http:
        wait_ready(http, timeout=60)
        for path, body in (
            ("/score", {"text_1": QUERY, "text_2": DOCUMENTS}),
            ("/rerank", {"query": QUERY, "documents": DOCUMENTS}),
            ("/classify", {"input": QUERY}),
        ):
            response = http.post(path, json=body)
            assert response.status_code == 400
            assert "need one started with --runner pooling" in response.json()["error"]["message"]


def test_truncate_prompt_tokens_cuts_each_scored_prompt(served):
    http, offline = served
    body = http.post(
        "/rerank", json={"query": QUERY, "documents": DOCUMENTS, "truncate_prompt_tokens": 3}
    ).json()
    pairs = 1 if offline.engine.pooling_task == "classify" else 2  # texts per prompt: a pair, or one text
    assert body["usage"]["total_tokens"] <= 3 * len(DOCUMENTS) * pairs
    assert len(body["results"]) == len(DOCUMENTS)
