"""POST /score (and /v1/score) and /rerank (and /v1/rerank, /v2/rerank: Jina's and Cohere's shape) as
vLLM serves them: the relevance of text pairs (engine/pair_scores.py), by a sequence classifier of one
output (a cross-encoder reranker) or, for an embedding model, the cosine of the two texts'
embeddings. A generating engine answers 400, as it does for /v1/embeddings."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.pair_scores import PairsError, cosine, pairs
from pagoda_runtime.server.admission import admit, check_model
from pagoda_runtime.server.errors import APIError
from pagoda_runtime.server.generation import generate, respond, truncated
from pagoda_runtime.server.merged_outputs import finals
from pagoda_runtime.server.pooled_inputs import pooled_prompt_limit
from pagoda_runtime.server.protocol import INT32_MAX, MAX_COMPLETIONS, Truncation, UsageInfo, ValidText
from pagoda_runtime.server.state import ServerState

SCORE_FIELDS = ("text_1", "text_2")
RERANK_FIELDS = ("query", "documents")


class ScoreRequest(ValidText, Truncation):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankRequest(ValidText, Truncation):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    query: str
    documents: list[str]
    top_n: int = Field(default=0, ge=0, le=INT32_MAX)  # 0: every document
    return_documents: bool = True  # Cohere's: False leaves the texts out of the results


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


async def create_score(body: ScoreRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    request_id = f"score-{uuid.uuid4().hex}"
    created = int(time.time())
    model = body.model or state.settings.served_model_name

    def whole(scores: list[float], tokens: int) -> ScoreResponse:
        data = [ScoreData(index=i, score=score) for i, score in enumerate(scores)]
        usage = UsageInfo(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        return ScoreResponse(id=request_id, created=created, model=model, data=data, usage=usage)

    texts = (body.text_1, body.text_2)
    return await score_pairs(state, request, body, texts, SCORE_FIELDS, request_id, whole)


async def create_rerank(body: RerankRequest, request: Request):
    state: ServerState = request.app.state.pagoda
    request_id = f"rerank-{uuid.uuid4().hex}"
    model = body.model or state.settings.served_model_name

    def whole(scores: list[float], tokens: int) -> RerankResponse:
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n or None]
        results = [
            RerankResult(
                index=i,
                document=RerankDocument(text=body.documents[i]) if body.return_documents else None,
                relevance_score=scores[i],
            )
            for i in ranked
        ]
        return RerankResponse(
            id=request_id, model=model, usage=RerankUsage(total_tokens=tokens), results=results
        )

    texts = (body.query, body.documents)
    return await score_pairs(state, request, body, texts, RERANK_FIELDS, request_id, whole)


async def score_pairs(
    state: ServerState,
    request: Request,
    body: ScoreRequest | RerankRequest,
    texts: tuple[str | list[str], str | list[str]],
    names: tuple[str, str],
    request_id: str,
    whole: Callable[[list[float], int], BaseModel],
):
    """Pair the texts (`names`: their fields) and run the pairs through the engine: each as one
    prompt for a classifier, each distinct text once for an embedding model, truncated as `body`
    asks; `whole(scores, prompt tokens)` is the response."""
    lora_name = check_model(state, body.model, request)
    try:
        paired = pairs(*texts, names)
    except PairsError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc
    if len(paired) > MAX_COMPLETIONS:
        raise APIError(
            400,
            f"the request pairs {len(paired)} texts, more than the {MAX_COMPLETIONS} one request may score; "
            "split them over several requests.",
            param=names[1],
        )
    engine = await admit(state)
    tokenizer = engine.tokenizer
    if engine.pooling_task == "classify":
        prompts = [tokenizer.encode_pair(a, b) for a, b in paired]
        fields = [{"prompt": f"{names[0]} and {names[1]}"}] * len(prompts)
        params = PoolingParams(task="score")
    else:
        # Each distinct text once, its errors named by the field it first came from.
        sources = {}
        for a, b in paired:
            sources.setdefault(a, names[0])
            sources.setdefault(b, names[1])
        distinct = list(sources)
        prompts = [tokenizer.encode(text) for text in distinct]
        fields = [{"prompt": sources[text]} for text in distinct]
        params = PoolingParams()
    limit = pooled_prompt_limit(engine)
    streams = [
        generate(
            state, engine, truncated(ids, body, limit), params, f"{request_id}-{i}", fields[i], lora_name
        )
        for i, ids in enumerate(prompts)
    ]

    def scored(outputs: list[RequestOutput]) -> BaseModel:
        tokens = sum(len(out.prompt_token_ids) for out in outputs)
        if params.task == "score":
            return whole([out.pooled[0] for out in outputs], tokens)
        vectors = dict(zip(distinct, (out.pooled for out in outputs), strict=True))
        return whole([cosine(vectors[a], vectors[b]) for a, b in paired], tokens)

    return await respond(request, state, finals(streams), scored, None)
