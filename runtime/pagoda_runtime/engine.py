"""The synchronous engine loop: requests in, one step at a time, token and text deltas out.

`make_request` checks and tokenizes a prompt (request_validation.py) and `add` queues one sequence
per sample; `step` lets the scheduler pick a batch, runs it on the model runner, hands each
sampled token to its request's stop rules (request_state.py) and returns a RequestOutput
(cumulative, with `delta`) for every request that changed. What the loop runs on is built once by
engine_build.py; scoring a text is scoring.py.
"""

from __future__ import annotations

import time

from pagoda_runtime.config import EngineConfig
from pagoda_runtime.engine_build import build_engine
from pagoda_runtime.engine_stats import EngineStats, StepTiming
from pagoda_runtime.grammar_mask import GrammarCompiler
from pagoda_runtime.model_source import LoadedModel
from pagoda_runtime.outputs import CompletionOutput, RequestOutput
from pagoda_runtime.request_state import Request
from pagoda_runtime.request_validation import RequestRejected, check_request
from pagoda_runtime.sampling_params import SamplingParams
from pagoda_runtime.sequence import Sequence
from pagoda_runtime.structured_outputs import StructuredOutputError
from pagoda_runtime.tensor_parallel import SINGLE_PROCESS, TensorParallel


class LLMEngine:
    def __init__(
        self,
        engine_config: EngineConfig,
        loaded: LoadedModel | None = None,
        tp: TensorParallel = SINGLE_PROCESS,
        layout: str = "1x1",
    ) -> None:
        """`loaded`: a model already in memory (the benchmarks' random weights) instead of
        `engine_config.model`; `tp`: this process's rank (rank 0 runs this loop, see build_engine);
        `layout`: nodes x ranks per node, for the start-up banner."""
        parts = build_engine(engine_config, loaded, tp, layout)
        self.engine_config = engine_config
        self.quantization = parts.quantization
        self.model_config = parts.model_config
        self.tokenizer = parts.tokenizer
        self.runner = parts.runner
        self.block_manager = parts.block_manager
        self.scheduler = parts.scheduler
        self.max_model_len = parts.max_model_len
        self.memory = parts.memory
        self.requests: dict[str, Request] = {}
        self.grammars = GrammarCompiler(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.last_step_timing: StepTiming | None = None

    # ---- requests ----------------------------------------------------------------------------

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        internal: bool = False,
    ) -> Request:
        """Check and tokenize without touching the engine's state (safe while a step runs); raises
        RequestRejected for a request that cannot run here."""
        self._check_unique(request_id)
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
        check_request(
            token_ids,
            params.max_tokens,
            params.min_tokens,
            self.model_config.vocab_size,
            self.max_model_len,
        )
        grammars = None
        if params.structured_outputs is not None:
            try:
                grammars = self.grammars.matchers(params.structured_outputs, params.n)
            except StructuredOutputError as exc:
                message = f"Invalid structured output: {exc}."
                raise RequestRejected(message, param="structured_outputs") from exc
        arrival = time.monotonic() if arrival_time is None else arrival_time
        return Request(request_id, text, token_ids, params, self.tokenizer, arrival, internal, grammars)

    def add(self, request: Request) -> None:
        self._check_unique(request.request_id)
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

    def _check_unique(self, request_id: str) -> None:
        if request_id in self.requests:
            raise RequestRejected(f"A request with id {request_id!r} is already running; use a unique id.")

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now, freeing its blocks; returns its final output, or None if unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        deltas = []
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
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

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        shape = batch.shape()
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
            seq: Sequence = batch.seqs[row]
            request = self.requests[seq.group.request_id]
            delta = request.append(seq, token, logprobs, self.model_config.eos_token_ids, self.max_model_len)
            if delta.finish_reason is not None:
                self.scheduler.finish(seq, delta.finish_reason)
            deltas.setdefault(request.request_id, []).append(delta)
            request.metrics.first_token_time = request.metrics.first_token_time or now
            request.metrics.last_token_time = now
        outputs = []
        for request_id, request_deltas in deltas.items():
            output = self.requests[request_id].output(request_deltas)
            if output.finished:
                output.metrics.finished_time = now
                del self.requests[request_id]
            outputs.append(output)
        self.last_step_timing = StepTiming(
            num_seqs=len(batch),
            shape=shape,
            schedule_s=scheduled - started,
            prepare_s=self.runner.last_prepare_s,
            execute_s=executed - scheduled,
            output_s=time.perf_counter() - executed,
        )
        return outputs
