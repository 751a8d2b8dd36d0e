"""The synchronous engine: requests in, one step at a time, token and text deltas out.

`add_request` validates and tokenizes a prompt and queues one sequence per sample; `step` lets
the scheduler pick a batch, runs it, appends the sampled tokens, applies the stop rules and
returns a RequestOutput (cumulative, with `delta`) for every request that changed. `score` gives
the model's next-token logits over a whole text, which is how quantization quality is measured.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from pagoda_runtime.block_manager import BlockManager
from pagoda_runtime.config import EngineConfig, ModelConfig
from pagoda_runtime.detokenizer import IncrementalDetokenizer
from pagoda_runtime.grammar_mask import GrammarCompiler, advance
from pagoda_runtime.memory_report import MemoryReport
from pagoda_runtime.model_runner import ModelRunner, dtype_name, resolve_device, resolve_dtype
from pagoda_runtime.model_source import LoadedModel, load_model_source
from pagoda_runtime.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from pagoda_runtime.quantization_selection import select_quantization
from pagoda_runtime.sampling_params import SamplingParams
from pagoda_runtime.scheduler import Scheduler
from pagoda_runtime.sequence import Sequence, SequenceGroup
from pagoda_runtime.sizing import weight_bytes
from pagoda_runtime.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int  # requests with no sample running
    num_running: int  # requests with at least one sample running
    kv_cache_usage: float  # fraction of KV blocks in use
    prefix_cache_queries: int  # cumulative, in prompt tokens
    prefix_cache_hits: int  # cumulative, in prompt tokens
    num_preemptions: int  # cumulative


@dataclass(frozen=True)
class StepTiming:
    """Where one step's wall time went; the host parts are what the GPU may wait on."""

    num_seqs: int
    schedule_s: float
    prepare_s: float  # building the batch tensors
    execute_s: float  # the model and the sampler, including waiting for the device
    output_s: float  # appending tokens, stop rules, detokenizing

    @property
    def host_fraction(self) -> float:
        total = self.schedule_s + self.execute_s + self.output_s
        return (self.schedule_s + self.prepare_s + self.output_s) / total if total else 0.0


class Request:
    """One request's state in the engine: its sequences, their detokenizers, what was streamed."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        arrival_time: float,
        internal: bool = False,
        grammars: list | None = None,
    ) -> None:
        self.prompt = prompt
        # The server's own readiness canaries: served like any request, but not counted in the
        # load metrics that autoscaling and users read.
        self.internal = internal
        self.group = SequenceGroup(request_id, prompt_token_ids, params, arrival_time)
        self.group.seqs = [Sequence(self.group, i) for i in range(params.n)]
        for seq, grammar in zip(self.group.seqs, grammars or (), strict=False):
            seq.grammar = grammar
        self.detokenizers = [
            IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
            )
            for _ in range(params.n)
        ]
        self.logprobs: list[list[TokenLogprobs] | None] = [
            [] if params.logprobs is not None else None for _ in range(params.n)
        ]
        self.metrics = RequestMetrics(arrival_time=arrival_time)

    @property
    def request_id(self) -> str:
        return self.group.request_id

    @property
    def seqs(self) -> list[Sequence]:
        return self.group.seqs

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def output(self, deltas: list[CompletionOutput]) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=seq.index,
                text=self.detokenizers[seq.index].output_text,
                token_ids=list(seq.output_token_ids),
                logprobs=None if self.logprobs[seq.index] is None else list(self.logprobs[seq.index]),
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in self.seqs
        ]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.group.prompt_token_ids,
            outputs=outputs,
            finished=self.finished,
            metrics=self.metrics,
            num_cached_tokens=self.seqs[0].num_cached_tokens,
            delta=deltas,
        )


class LLMEngine:
    def __init__(self, engine_config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        """`loaded`: a model already in memory (the benchmarks' random weights) instead of
        `engine_config.model`."""
        self.engine_config = engine_config
        device = resolve_device(engine_config.device)
        dtype = resolve_dtype(engine_config.dtype, device)
        if loaded is None:
            loaded = load_model_source(engine_config.model, dtype, keep_quantized=True)
        self.quantization = select_quantization(
            engine_config.quantization, loaded.quantization, device.type, engine_config.model
        )
        if loaded.quantization is not None and self.quantization != loaded.quantization:
            if engine_config.quantization == "auto":
                logger.info(
                    "%s stores %s blocks; on the %s they are dequantized at load "
                    "(--quantization %s keeps them packed)",
                    engine_config.model,
                    loaded.quantization,
                    device.type,
                    loaded.quantization,
                )
            loaded = loaded.dequantized(dtype)
        self.model_config: ModelConfig = loaded.config
        self.tokenizer: Tokenizer = loaded.tokenizer
        if engine_config.max_num_batched_tokens < 1 or engine_config.max_num_seqs < 1:
            raise ValueError("--max-num-batched-tokens and --max-num-seqs must both be at least 1")
        limit = engine_config.max_model_len or self.model_config.max_position_embeddings
        self.runner = ModelRunner(self.model_config, loaded.weights, engine_config, limit, self.quantization)
        capacity = self.runner.num_blocks * engine_config.block_size
        if limit > capacity:
            if engine_config.max_model_len is not None:
                raise ValueError(
                    f"--max-model-len {limit} does not fit in the KV cache, which holds {capacity} tokens; "
                    "lower --max-model-len or raise --kv-cache-memory"
                )
            logger.warning(
                "the KV cache holds %d tokens; max_model_len lowered from %d to that", capacity, limit
            )
            limit = capacity
        self.max_model_len = limit
        self.block_manager = BlockManager(
            self.runner.num_blocks, engine_config.block_size, engine_config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, engine_config.max_num_seqs, engine_config.max_num_batched_tokens
        )
        self.requests: dict[str, Request] = {}
        self.grammars = GrammarCompiler(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.last_step_timing: StepTiming | None = None
        self.memory = MemoryReport(
            model=engine_config.model,
            quantization=self.quantization,
            dtype=dtype_name(dtype),
            kv_cache_dtype=self.runner.kv_cache_dtype_name,
            weight_bytes=self.runner.weight_bytes,
            predicted_weight_bytes=weight_bytes(
                self.model_config.to_sizing(), self.quantization, dtype_name(dtype)
            ),
            kv_bytes_per_block=self.runner.kv_bytes_per_block,
            block_size=engine_config.block_size,
            num_kv_blocks=self.runner.num_blocks,
        )
        logger.info("memory: %s", self.memory.describe())

    # ---- requests ----------------------------------------------------------------------------

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        internal: bool = False,
    ) -> Request:
        """Validate and tokenize without touching the engine's state (safe while a step runs)."""
        if request_id in self.requests:
            raise ValueError(f"a request with id {request_id!r} is already running; use a unique id")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty; send at least one token")
        vocab = self.model_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary of {vocab} tokens")
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        if len(token_ids) > capacity:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but the whole KV cache holds {capacity}; shorten it"
            )
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, leaving no room to generate within "
                f"max_model_len {self.max_model_len}; shorten the prompt"
            )
        if params.max_tokens is not None and len(token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"the prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len {self.max_model_len}; shorten the prompt or lower max_tokens"
            )
        arrival = time.monotonic() if arrival_time is None else arrival_time
        grammars = None
        if params.structured_outputs is not None:
            grammars = self.grammars.matchers(params.structured_outputs, params.n)
        return Request(request_id, text, token_ids, params, self.tokenizer, arrival, internal, grammars)

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"a request with id {request.request_id!r} is already running; use a unique id")
        self.requests[request.request_id] = request
        for seq in request.seqs:
            self.scheduler.add(seq)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.add(self.make_request(request_id, prompt, params, arrival_time))

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now, freeing its blocks; returns its final output, or None if unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        deltas = []
        for seq in request.seqs:
            if not seq.is_finished:
                self._finish(seq, "abort")
                deltas.append(CompletionOutput(index=seq.index, finish_reason="abort"))
        request.metrics.finished_time = time.monotonic()
        return request.output(deltas)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        # Called from the server's event loop while a step may run in the engine's thread: read
        # snapshots (list() of a dict or list is atomic under the GIL), never live iterators.
        requests = [r for r in list(self.requests.values()) if not r.internal]
        running_ids = {seq.group.request_id for seq in list(self.scheduler.running)}
        num_running = sum(1 for r in requests if r.request_id in running_ids)
        return EngineStats(
            num_waiting=len(requests) - num_running,
            num_running=num_running,
            kv_cache_usage=self.block_manager.usage,
            prefix_cache_queries=self.block_manager.prefix_queries,
            prefix_cache_hits=self.block_manager.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )

    # ---- scoring -----------------------------------------------------------------------------

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Float32 next-token logits [len(token_ids), vocab] of the engine's own model: row i predicts
        token i + 1. One prefill over blocks borrowed from the block manager and given back, so it
        may run between steps while requests hold other blocks."""
        if not token_ids:
            raise ValueError("there is nothing to score; send at least one token")
        vocab = self.model_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the model's vocabulary of {vocab} tokens")
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                f"{len(token_ids)} tokens exceed max_model_len {self.max_model_len}; score a shorter text"
            )
        group = SequenceGroup("score", list(token_ids), SamplingParams(max_tokens=1), time.monotonic())
        seq = Sequence(group, 0)
        needed = self.block_manager.blocks_needed(seq, seq.num_tokens)
        if not self.block_manager.can_append(seq, seq.num_tokens):
            raise ValueError(
                f"scoring {seq.num_tokens} tokens needs {needed} free KV blocks but "
                f"{self.block_manager.num_free_blocks} are free; wait for running requests to finish"
            )
        self.block_manager.append(seq, seq.num_tokens)
        try:
            return self.runner.score(seq)
        finally:
            self.block_manager.free(seq)

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        scheduled = time.perf_counter()
        now = time.monotonic()
        for seq in batch.seqs:
            metrics = self.requests[seq.group.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        rows, sampled = self.runner.execute(batch)
        executed = time.perf_counter()
        self.scheduler.update(batch)
        now = time.monotonic()
        deltas: dict[str, list[CompletionOutput]] = {}
        for row, token, logprobs in zip(rows, sampled.token_ids, sampled.logprobs, strict=True):
            seq = batch.seqs[row]
            request = self.requests[seq.group.request_id]
            deltas.setdefault(request.request_id, []).append(self._append(request, seq, token, logprobs))
            request.metrics.first_token_time = request.metrics.first_token_time or now
            request.metrics.last_token_time = now
        outputs = []
        for request_id, request_deltas in deltas.items():
            request = self.requests[request_id]
            if request.finished:
                request.metrics.finished_time = now
                del self.requests[request_id]
            outputs.append(request.output(request_deltas))
        self.last_step_timing = StepTiming(
            num_seqs=len(batch),
            schedule_s=scheduled - started,
            prepare_s=self.runner.last_prepare_s,
            execute_s=executed - scheduled,
            output_s=time.perf_counter() - executed,
        )
        return outputs

    def _append(
        self, request: Request, seq: Sequence, token: int, logprobs: TokenLogprobs | None
    ) -> CompletionOutput:
        params = seq.params
        seq.token_ids.append(token)
        if logprobs is not None:
            request.logprobs[seq.index].append(logprobs)
        detokenizer = request.detokenizers[seq.index]
        text = ""
        grammar_done = advance(seq, token)
        if token in params.stop_token_ids:
            self._finish(seq, "stop", token)
        elif not params.ignore_eos and token in self.model_config.eos_token_ids:
            self._finish(seq, "stop")
        else:
            if params.detokenize:
                delta = detokenizer.add_tokens([token])
                text = delta.text
                if delta.stop is not None:
                    self._finish(seq, "stop", delta.stop)
            if not seq.is_finished and grammar_done:
                self._finish(seq, "stop")
            if not seq.is_finished and (
                seq.num_output_tokens == params.max_tokens or seq.num_tokens >= self.max_model_len
            ):
                self._finish(seq, "length")
        if seq.is_finished and params.detokenize:
            text += detokenizer.finish()
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=[token],
            logprobs=None if logprobs is None else [logprobs],
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        self.scheduler.finish(seq, reason)
        seq.stop_reason = stop_reason
        self.runner.sampler.release(seq)
