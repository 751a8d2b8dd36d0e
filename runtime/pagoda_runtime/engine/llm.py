"""The offline API: `LLM(model=...).generate(prompts, params)`, one finished output per prompt;
`chat(conversations, params)` renders each conversation with the model's chat template first.

With tensor_parallel_size=N the model is split over N ranks on this machine, started as
`serve --tensor-parallel-size N` starts them (parallel/group_leader.py): this process is rank 0
and spawns the others, so a script that builds one needs vLLM's `if __name__ == "__main__":`
guard. A rank that dies ends this process, as it ends a serving pod; `shutdown()` (or the exit of
this process) stops the ranks.
"""

from __future__ import annotations

import itertools
import logging
import socket
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.pooling import PoolingParams, parse_pooler_config
from pagoda_runtime.contract.speculative import parse_speculative_config
from pagoda_runtime.engine.chat_prompt import chat_prompt_ids
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from pagoda_runtime.engine.pair_scores import cosine, pairs
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.parallel.group_leader import lead_group
from pagoda_runtime.parallel.rank_group import LogSettings, RankGroup
from pagoda_runtime.parallel.world_layout import world_layout

Prompt = str | list[int]
Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """`model`: a Hugging Face folder, a .gguf file or the bundled model's name (with
    load_format="dummy", a model shape's name); the other keyword arguments are EngineConfig fields
    (max_num_seqs, block_size, kv_cache_memory, tensor_parallel_size, ...)."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        dtype: str = "auto",
        device: str = "auto",
        quantization: str = "auto",
        max_model_len: int | None = None,
        **engine_kwargs,
    ) -> None:
        speculative = engine_kwargs.get("speculative_config")
        if speculative is not None:
            engine_kwargs["speculative_config"] = parse_speculative_config(speculative)
        pooler = engine_kwargs.get("pooler_config")
        if pooler is not None:
            engine_kwargs["pooler_config"] = parse_pooler_config(pooler)
        config = EngineConfig(
            model=str(model),
            dtype=dtype,
            device=device,
            quantization=quantization,
            max_model_len=max_model_len,
            **engine_kwargs,
        )
        self._stop_ranks: weakref.finalize | None = None
        if config.tensor_parallel_size == 1:
            self.engine = LLMEngine(config)
        else:
            self.engine = self._lead(config)
        self._ids = itertools.count()

    def _lead(self, config: EngineConfig) -> LLMEngine:
        # On this machine only: the environment of a LeaderWorkerSet pod is not this group's.
        world = world_layout(config.tensor_parallel_size, _free_port(), env={})
        level = logging.getLevelName(logging.getLogger("pagoda").getEffectiveLevel())
        group = RankGroup(world, config, LogSettings("text", level), termination_log=None)
        try:
            engine = lead_group(group)
        except BaseException:
            group.finish(1)
            raise
        self._stop_ranks = weakref.finalize(self, group.finish, 0)
        return engine

    def shutdown(self) -> None:
        """Stop the other ranks of a tensor-parallel LLM (the exit of this process does too)."""
        if self._stop_ranks is not None:
            self._stop_ranks()

    def add_lora(self, name: str, path: str) -> None:
        """Serve the PEFT LoRA adapter folder `path` as `name` (the engine runs with enable_lora)."""
        self.engine.add_lora(name, path)

    def remove_lora(self, name: str) -> None:
        self.engine.remove_lora(name)

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: SamplingParams with the model's recommended sampling (its generation_config.json:
        temperature, top_p, top_k, min_p, repetition_penalty), what generate uses when given none."""
        return SamplingParams(**self.engine.sampling_defaults)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} messages) or several, rendered as the
        server renders them (engine/chat_prompt.py); `tools` in OpenAI's shape."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = [
            chat_prompt_ids(
                self.engine.tokenizer,
                c,
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=chat_template_kwargs,
            )
            for c in conversations
        ]
        return self.generate(prompts, params)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams | PoolingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
        lora_name: str | None | Sequence[str | None] = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; the outputs come back in the order of the prompts.
        `priority`: one per prompt, as vLLM takes it (lower first; needs scheduling_policy="priority").
        `lora_name`: the LoRA adapter (add_lora) all prompts or each prompt runs with; None: the base
        model."""
        prompts = _prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.get_default_sampling_params()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(
                f"got {len(params)} sampling params for {len(prompts)} prompts; pass one or one each"
            )
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"got {len(priority)} priorities for {len(prompts)} prompts; pass one each")
        loras = (
            [lora_name] * len(prompts) if lora_name is None or isinstance(lora_name, str) else list(lora_name)
        )
        if len(loras) != len(prompts):
            raise ValueError(f"got {len(loras)} LoRA names for {len(prompts)} prompts; pass one or one each")
        request_ids = [f"offline-{next(self._ids)}" for _ in prompts]
        # All validated before any is queued, so that a bad prompt leaves nothing behind. Only the
        # final outputs are returned, and those hold each sample whole whatever the output kind.
        requests = []
        try:
            for request_id, prompt, p, rank, lora in zip(
                request_ids, prompts, params, priority, loras, strict=True
            ):
                run = replace(p, output_kind="delta") if isinstance(p, SamplingParams) else p
                requests.append(
                    self.engine.make_request(request_id, prompt, run, priority=rank, lora_name=lora)
                )
        except BaseException:
            for request in requests:
                self.engine.release(request)
            raise
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

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        use_tqdm: bool = False,
        lora_name: str | None | Sequence[str | None] = None,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """Each prompt's embedding, in the order of the prompts (an LLM made with runner="pooling");
        vLLM's LLM.embed: `outputs.embedding`; `pooling_params` one for all prompts or one each."""
        prompts = _prompt_list(prompts)
        params = pooling_params or PoolingParams()
        if isinstance(params, PoolingParams):
            params = [params] * len(prompts)
        done = self.generate(prompts, list(params), use_tqdm, lora_name=lora_name)
        return [
            EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.pooled)) for o in done
        ]

    def classify(
        self,
        prompts: Prompt | Sequence[Prompt],
        use_tqdm: bool = False,
        lora_name: str | None | Sequence[str | None] = None,
    ) -> list[ClassificationRequestOutput]:
        """Each prompt's class probabilities, in the order of the prompts (a sequence classifier
        under runner="pooling"); vLLM's LLM.classify: `outputs.probs`, one per label."""
        prompts = _prompt_list(prompts)
        params = [PoolingParams(task="classify")] * len(prompts)
        done = self.generate(prompts, params, use_tqdm, lora_name=lora_name)
        return [
            ClassificationRequestOutput(o.request_id, o.prompt_token_ids, ClassificationOutput(o.pooled))
            for o in done
        ]

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        use_tqdm: bool = False,
        lora_name: str | None = None,
    ) -> list[ScoringRequestOutput]:
        """The relevance of each pair (one text and N, or N and N: engine/pair_scores.py), in the
        order of the pairs; vLLM's LLM.score: `outputs.score`. A sequence classifier of one output
        scores each pair as one prompt; an embedding model by the cosine of the two embeddings."""
        paired = pairs(data_1, data_2)
        if self.engine.pooling_task == "classify":
            prompts = [self.get_tokenizer().encode_pair(a, b) for a, b in paired]
            params = [PoolingParams(task="score")] * len(prompts)
            done = self.generate(prompts, params, use_tqdm, lora_name=lora_name)
            return [
                ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.pooled[0]))
                for o in done
            ]
        texts = list(dict.fromkeys(text for pair in paired for text in pair))
        embedded = dict(zip(texts, self.embed(texts, use_tqdm, lora_name), strict=True))
        return [
            ScoringRequestOutput(
                f"{embedded[a].request_id}-{embedded[b].request_id}",
                embedded[a].prompt_token_ids + embedded[b].prompt_token_ids,
                ScoringOutput(cosine(embedded[a].outputs.embedding, embedded[b].outputs.embedding)),
            )
            for a, b in paired
        ]


def _prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (a text or a list of token ids) or several, as a list."""
    if isinstance(prompts, str) or (prompts and all(isinstance(t, int) for t in prompts)):
        return [prompts]
    return list(prompts)


def _free_port() -> int:
    """A TCP port free on this machine now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
