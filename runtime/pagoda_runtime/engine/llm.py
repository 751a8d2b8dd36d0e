"""The offline API: `LLM(model=...).generate(prompts, params)`, one finished output per prompt;
`chat(conversations, params)` renders each conversation with the model's chat template first."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.tokenizer import Tokenizer

Prompt = str | list[int]
Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """`model`: a Hugging Face folder, a .gguf file or the bundled model's name (with
    load_format="dummy", a model shape's name); the other keyword arguments are EngineConfig fields
    (max_num_seqs, block_size, kv_cache_memory, ...)."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        dtype: str = "auto",
        device: str = "auto",
        quantization: str = "auto",
        max_model_len: int | None = None,
        **engine_kwargs,
    ) -> None:
        config = EngineConfig(
            model=str(model),
            dtype=dtype,
            device=device,
            quantization=quantization,
            max_model_len=max_model_len,
            **engine_kwargs,
        )
        self.engine = LLMEngine(config)
        self._ids = itertools.count()

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} messages) or several; `tools` in OpenAI's
        shape are handed to the template, as the server does."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        tokenizer = self.engine.tokenizer
        extra = {"tools": [dict(t) for t in tools]} if tools else {}
        prompts = [
            # The template writes the special tokens (BOS included) itself.
            tokenizer.encode(
                tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt, **extra),
                add_special_tokens=False,
            )
            for c in conversations
        ]
        return self.generate(prompts, params)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; the outputs come back in the order of the prompts."""
        if isinstance(prompts, str) or (prompts and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(
                f"got {len(params)} sampling params for {len(prompts)} prompts; pass one or one each"
            )
        request_ids = [f"offline-{next(self._ids)}" for _ in prompts]
        # All validated before any is queued, so that a bad prompt leaves nothing behind. Only the
        # final outputs are returned, and those hold each sample whole whatever the output kind.
        requests = [
            self.engine.make_request(request_id, prompt, replace(p, output_kind="delta"))
            for request_id, prompt, p in zip(request_ids, prompts, params, strict=True)
        ]
        for request in requests:
            self.engine.add(request)
        finished: dict[str, RequestOutput] = {}
        progress = None
        if use_tqdm:
            from tqdm import tqdm

            progress = tqdm(total=len(prompts), desc="generating")
        while self.engine.has_unfinished():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    if progress is not None:
                        progress.update(1)
        if progress is not None:
            progress.close()
        return [finished[request_id] for request_id in request_ids]
