"""The engine loop: requests in, one step at a time, token and text deltas out.

`make_request` checks and tokenizes a prompt (request_validation.py) and `add` queues one sequence
per sample; `step` lets the scheduler pick a batch, launches it on the model runner, hands each
sampled token to its request's stop rules (request_state.py) and returns a RequestOutput (with
`delta`) for every request that changed. With async scheduling (`_step_overlapped`, on by default
on CUDA) a step is scheduled and launched before the tokens of the step before it are read, so
the host's work never stands between two steps on the device. What the loop runs on is built
once by engine_build.py; scoring a text is scoring.py.

With speculative decoding (--speculative-config) a step may emit several tokens of a sequence:
the ones of its draft the target accepted and the target's own after them. The proposer drafts
from the tokens the host has read, so a step that may speculate is not overlapped: its tokens are
read before the next is scheduled. With async scheduling on (the default on a GPU), steps are
overlapped only while more sequences run than the config's disable_by_batch_size, where none
drafts; when the batch shrinks to that, the step in flight is read (`_drain`) and speculation
resumes.
"""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.pooling import PoolingParams, dimensions_refusal
from pagoda_runtime.engine.bad_words import BadWords
from pagoda_runtime.engine.build import build_engine
from pagoda_runtime.engine.grammar_mask import GrammarCompiler
from pagoda_runtime.engine.lora_manager import LoraManager
from pagoda_runtime.engine.outputs import CompletionOutput, RequestOutput
from pagoda_runtime.engine.pooler import EMBEDDING_RUN
from pagoda_runtime.engine.protocol import LoraAdapterError, LoraNotFound, ServedLora
from pagoda_runtime.engine.request_state import Request, SampledToken
from pagoda_runtime.engine.request_validation import (
    RequestRejected,
    check_priority,
    check_request,
    first_out_of_vocabulary,
)
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import LoraRequest, Sequence
from pagoda_runtime.engine.stats import EngineStats, SpecDecodeCounts, StepClock, StepTiming
from pagoda_runtime.engine.structured_outputs import StructuredOutputError
from pagoda_runtime.executor.model_runner import LaunchedStep
from pagoda_runtime.executor.sampler import SamplerOutput
from pagoda_runtime.loading.model_source import LoadedModel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel


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
        self.draft_runner = parts.draft_runner
        self.block_manager = parts.block_manager
        self.scheduler = parts.scheduler
        self.max_model_len = parts.max_model_len
        self.memory = parts.memory
        self.loras = parts.loras
        self.sampling_defaults = parts.sampling_defaults
        self.pooler = parts.pooler
        self.requests: dict[str, Request] = {}
        self.grammars = GrammarCompiler(
            self.tokenizer, self.model_config.architecture.vocab_size, self.model_config.eos_token_ids
        )
        self.last_step_timing: StepTiming | None = None
        # Launch each step before reading the last one's tokens where the device runs apart from
        # the host; a CPU computes the forward in the launch itself, so there is nothing to hide.
        speculative = engine_config.speculative_config
        overlap = (
            self.runner.device.type == "cuda"
            if engine_config.async_scheduling is None
            else engine_config.async_scheduling
        )
        # Not under pooling: the pooler places each step's hidden states by the counts of the
        # steps before it, which an overlapped launch precedes (and a prefill has nothing to hide).
        self.async_scheduling = overlap and speculative is None and not engine_config.pooling
        # With speculation: steps overlap while more sequences run than this (none drafts then).
        self.overlap_above = speculative.disable_by_batch_size if overlap and speculative else None
        self.spec_decode = (
            None if speculative is None else SpecDecodeCounts.empty(speculative.num_speculative_tokens)
        )
        self._in_flight: LaunchedStep | None = None  # launched, its tokens not yet read
        self.num_failed_steps = 0  # steps that raised, whose requests fail_step ended

    # ---- requests ----------------------------------------------------------------------------

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
        internal: bool = False,
        priority: int = 0,
        lora_name: str | None = None,
    ) -> Request:
        """Check and tokenize without touching the engine's state (safe while a step runs); raises
        RequestRejected for a request that cannot run here. `priority`: lower is served first under
        the priority policy (engine/priority.py). `lora_name`: a served LoRA adapter the request runs
        with, held until the request ends."""
        self._check_unique(request_id)
        check_priority(priority, self.engine_config.scheduling_policy)
        pooling = self._checked_pooling(params)
        params = self._run_as(params)
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
        if self.engine_config.pooling and len(token_ids) >= self.max_model_len:
            raise RequestRejected(
                f"This model embeds at most {self.max_model_len - 1} tokens (max_model_len "
                f"{self.max_model_len} less one), but the prompt has {len(token_ids)}; shorten it.",
                param="prompt",
            )
        check_request(token_ids, params, self.model_config.architecture.vocab_size, self.max_model_len)
        grammars = None
        if params.structured_outputs is not None:
            try:
                grammars = self.grammars.matchers(params.structured_outputs, params.n)
            except StructuredOutputError as exc:
                message = f"Invalid structured output: {exc}."
                raise RequestRejected(message, param="structured_outputs") from exc
        bad_words = self._bad_words(params)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        request = Request(
            request_id,
            text,
            token_ids,
            params,
            self.tokenizer,
            arrival,
            self.max_model_len,
            internal,
            grammars,
            priority,
            pooling,
        )
        request.group.bad_words = bad_words
        if lora_name is not None:
            request.group.lora = self._acquire_lora(lora_name)
        return request

    @property
    def pooling_task(self) -> str | None:
        """What this engine makes of prompts under --runner pooling (contract/pooling.POOLING_TASKS):
        a sequence classifier classifies, any other model embeds; None where it generates."""
        if not self.engine_config.pooling:
            return None
        return "classify" if self.model_config.classifier is not None else "embed"

    def _checked_pooling(self, params: SamplingParams | PoolingParams) -> PoolingParams | None:
        """A pooled request's PoolingParams, once this model can serve them."""
        if not isinstance(params, PoolingParams):
            return None
        task = self.pooling_task
        if task == "classify" and params.task == "score":
            labels = self.model_config.classifier.labels
            if len(labels) != 1:
                raise RequestRejected(
                    f"This classifier has {len(labels)} labels, and scoring needs one that outputs a single "
                    "relevance score; use /classify (LLM.classify offline)."
                )
        elif task is not None and params.task != task:
            raise RequestRejected(_TASK_REFUSALS[task])
        if params.dimensions is not None:
            config = self.model_config
            refusal = dimensions_refusal(
                params.dimensions, config.matryoshka, config.architecture.hidden_size
            )
            if refusal is not None:
                raise RequestRejected(refusal, param="dimensions")
        return params

    def _run_as(self, params: SamplingParams | PoolingParams) -> SamplingParams:
        """The sampling a request runs with: its own, or, to embed its prompt (--runner pooling),
        one greedy token after the prompt that ends the sequence and is never shown."""
        pooling = self.engine_config.pooling
        if isinstance(params, PoolingParams) and pooling:
            return EMBEDDING_RUN
        if pooling:
            raise RequestRejected(_TASK_REFUSALS[self.pooling_task])
        if isinstance(params, PoolingParams):
            raise RequestRejected(
                "This engine generates text; embeddings, scores and classes need one started with "
                "--runner pooling."
            )
        return params

    def _bad_words(self, params: SamplingParams) -> BadWords | None:
        if not params.bad_words:
            return None
        try:
            encode = partial(self.tokenizer.encode, add_special_tokens=False)
            bad_words = BadWords.of(params.bad_words, encode)
        except ValueError as exc:
            raise RequestRejected(f"{exc}.", param="bad_words") from exc
        vocab_size = self.model_config.architecture.vocab_size
        if (bad := first_out_of_vocabulary(bad_words.token_ids(), vocab_size)) is not None:
            raise RequestRejected(
                f"bad_words spell token id {bad}, outside the model's vocabulary of {vocab_size} tokens; "
                "the tokenizer does not match the model.",
                param="bad_words",
            )
        return bad_words

    def _acquire_lora(self, name: str) -> LoraRequest:
        loras = self.loras
        if loras is None:
            raise RequestRejected(
                f"The model {name!r} names a LoRA adapter, but this server runs without --enable-lora.",
                param="model",
            )
        try:
            return loras.acquire(name)
        except LoraNotFound as exc:
            raise RequestRejected(f"{exc}", param="model", code="model_not_found") from exc

    def _forget(self, request_id: str) -> None:
        """The request has ended: the engine lets it go, and its adapter."""
        request = self.requests.pop(request_id)
        if self.pooler is not None:
            for seq in request.seqs:
                self.pooler.drop(seq)
        self.release(request)

    def release(self, request: Request) -> None:
        """Let go of the adapter of a request made (make_request) that ended or will never run."""
        if request.group.lora is not None:
            self.loras.release(request.group.lora)

    # ---- LoRA adapters -----------------------------------------------------------------------

    def add_lora(self, name: str, path: str, parent: str | None = None) -> None:
        """Serve the PEFT adapter folder `path` as `name`; LoraAdapterError when it cannot run here."""
        self._loras().add(name, path, parent)

    def remove_lora(self, name: str) -> None:
        """Stop serving `name` (LoraNotFound if it is not served); requests running with it finish."""
        self._loras().remove(name)

    def lora_adapters(self) -> dict[str, ServedLora]:
        return {} if self.loras is None else self.loras.served()

    def _loras(self) -> LoraManager:
        if self.loras is None:
            raise LoraAdapterError("LoRA adapters are not enabled; start the server with --enable-lora")
        return self.loras

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            self.release(request)
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
        priority: int = 0,
    ) -> None:
        self.add(self.make_request(request_id, prompt, params, arrival_time, priority=priority))

    def _check_unique(self, request_id: str) -> None:
        if request_id in self.requests:
            raise RequestRejected(f"A request with id {request_id!r} is already running; use a unique id.")

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request now, freeing its blocks; returns its final output, or None if unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self._forget(request_id)
        deltas = []
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                deltas.append(CompletionOutput(index=seq.index, finish_reason="abort"))
        request.metrics.finished_time = time.monotonic()
        return request.output(deltas)

    def fail_step(self) -> list[str]:
        """After step() raised: end the requests the step ran (every request, if none was running),
        freeing their blocks, so that the engine goes on with the others; the ids it ended."""
        in_flight, self._in_flight = self._in_flight, None
        seqs = [*self.scheduler.running, *(in_flight.batch.seqs if in_flight is not None else ())]
        failed = {seq.group.request_id for seq in seqs} & self.requests.keys() or set(self.requests)
        for request_id in failed:
            self.abort(request_id)
        self.num_failed_steps += 1
        return sorted(failed)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        # Called from the server's event loop while a step may run in the engine's thread: read
        # snapshots (list() of a dict or list is atomic under the GIL), never live iterators.
        requests = [r for r in list(self.requests.values()) if not r.internal]
        running_ids = {seq.group.request_id for seq in list(self.scheduler.running)}
        waiting = Counter(r.group.priority for r in requests if r.request_id not in running_ids)
        num_running = len(requests) - waiting.total()
        adapters: dict[bool, set[str]] = {True: set(), False: set()}
        for r in requests:
            if r.group.lora is not None:
                adapters[r.request_id in running_ids].add(r.group.lora.lora_name)
        return EngineStats(
            num_waiting=waiting.total(),
            num_running=num_running,
            waiting_by_priority=tuple(sorted(waiting.items())),
            kv_cache_usage=self.block_manager.usage,
            prefix_cache_queries=self.block_manager.prefix_queries,
            prefix_cache_hits=self.block_manager.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_failed_steps=self.num_failed_steps,
            spec_decode=self.spec_decode,
            running_lora_adapters=tuple(sorted(adapters[True])),
            waiting_lora_adapters=tuple(sorted(adapters[False])),
            max_lora=0 if self.loras is None else self.loras.max_loras,
        )

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step: schedule a batch, launch it, and return an output for every request the
        tokens read in this step changed.

        In order, those are the tokens of the batch launched here. With async scheduling they are
        the tokens of the batch the previous call launched: this call schedules and launches the
        next batch first (each sequence's next input id taken from the device), then reads them
        while the device computes. A sequence those tokens end (EOS, a stop string) computes one
        token more in the batch already launched, which is dropped, never streamed or counted."""
        if self.async_scheduling:
            return self._step_overlapped()
        if self.overlap_above is not None:
            if len(self.scheduler.running) > self.overlap_above:
                return self._step_overlapped()
            if self._in_flight is not None:
                return self._drain()
        clock = StepClock()
        batch = self.scheduler.schedule()
        clock.lap("schedule")
        if not batch.seqs:
            return []
        launched = self._launch(batch, None)
        clock.lap("launch")
        samples = launched.wait()
        clock.lap("wait")
        sampled = self._append_tokens(launched, samples)
        clock.lap("append")
        outputs = self._emit(sampled)
        clock.lap("emit")
        self._record(clock, launched, overlapped=False)
        return outputs

    def _drain(self) -> list[RequestOutput]:
        """Read the step in flight without launching another: the next step may speculate."""
        previous, self._in_flight = self._in_flight, None
        return self._emit(self._append_tokens(previous, previous.wait()))

    def _step_overlapped(self) -> list[RequestOutput]:
        clock = StepClock()
        previous, self._in_flight = self._in_flight, None
        batch = self.scheduler.schedule()
        clock.lap("schedule")
        launched = self._launch(batch, previous) if batch.seqs else None
        clock.lap("launch")
        sampled: list[SampledToken] = []
        if previous is not None:
            samples = previous.wait()
            clock.lap("wait")
            sampled = self._append_tokens(previous, samples)
            clock.lap("append")
        if launched is not None and not launched.sampled:
            # Its penalties or grammars read the tokens just appended.
            self.runner.sample(launched)
            clock.lap("sample")
        self._in_flight = launched
        outputs = self._emit(sampled)
        clock.lap("emit")
        if launched is not None:
            self._record(clock, launched, overlapped=True)
        return outputs

    def _launch(self, batch: ScheduledBatch, in_flight: LaunchedStep | None) -> LaunchedStep:
        now = time.monotonic()
        for seq in batch.seqs:
            metrics = self.requests[seq.group.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        if self.loras is not None:
            batch.lora_slots = self.loras.slots_for(batch.seqs)
        launched = self.runner.launch(batch, in_flight)
        self.scheduler.update(batch)
        return launched

    def _append_tokens(self, launched: LaunchedStep, samples: SamplerOutput) -> list[SampledToken]:
        """Append a step's tokens: after this the scheduler knows which sequences go on. A
        sequence that ended after the step was launched (aborted, or stopped by the tokens of
        the step before) drops its token; one that verified a draft appends the tokens the target
        accepted and its own after them, up to the first that ends it."""
        batch = launched.batch
        if launched.prompt_logprobs is not None:
            for span, entries, ranks in launched.prompt_logprobs.to_host():
                request = self.requests.get(batch.seqs[span.seq_index].group.request_id)
                if request is not None:
                    request.record_prompt_logprobs(span.first, entries, ranks)
        now = time.monotonic()
        eos = self.model_config.eos_token_ids
        widths = [1] * len(launched.rows) if launched.drafts is None else launched.drafts.widths
        emitted = samples.num_emitted or widths
        sampled = []
        first = 0
        for width, count in zip(widths, emitted, strict=True):
            seq: Sequence = batch.seqs[launched.rows[first]]
            rows = range(first, first + count)
            first += width
            if seq.is_finished:
                continue
            if width > 1:
                self.scheduler.accept(seq, width - 1, count - 1)
                self.spec_decode = self.spec_decode.add(width - 1, count - 1)
            request = self.requests[seq.group.request_id]
            for row in rows:
                appended = request.append_token(seq, samples.token_ids[row], samples.logprobs[row], eos)
                sampled.append(appended)
                if appended.finish_reason is not None:
                    self.scheduler.finish(seq, appended.finish_reason)
                    break
            request.metrics.first_token_time = request.metrics.first_token_time or now
            request.metrics.last_token_time = now
        return sampled

    def _emit(self, sampled: list[SampledToken]) -> list[RequestOutput]:
        """The tokens' text and stop strings, and one output per request they changed."""
        deltas: dict[str, list[CompletionOutput]] = {}
        ended: dict[int, int] = {}  # seq_id -> tokens after the one whose stop string ended it
        for appended in sampled:
            seq = appended.seq
            if seq.seq_id in ended:
                ended[seq.seq_id] += 1
                continue
            delta = appended.request.append_text(appended)
            if delta.finish_reason is not None:
                ended[seq.seq_id] = 0
                if seq.is_finished:
                    seq.finish_reason = delta.finish_reason  # a stop string outranks the length limit
                else:
                    self.scheduler.finish(seq, delta.finish_reason)
            deltas.setdefault(appended.request.request_id, []).append(delta)
        for appended in sampled:
            # Tokens a verify step emitted after a stop string ended their sequence are not its.
            if ended.get(appended.seq.seq_id):
                appended.request.drop_tokens(appended.seq, ended.pop(appended.seq.seq_id))
        now = time.monotonic()
        outputs = []
        for request_id, request_deltas in deltas.items():
            request = self.requests[request_id]
            output = request.output(request_deltas)
            if self.pooler is not None:
                # The token that ended the prompt's run is no output of an embedding request.
                output.outputs = [_without_tokens(o) for o in output.outputs]
                output.delta = [_without_tokens(o) for o in output.delta or ()]
            if output.finished:
                output.metrics.finished_time = now
                if self.pooler is not None:
                    output.pooled = self.pooler.pop(request.seqs[0], request.pooling)
                self._forget(request_id)
            outputs.append(output)
        return outputs

    def _record(self, clock: StepClock, launched: LaunchedStep, overlapped: bool) -> None:
        self.last_step_timing = clock.timing(
            len(launched.batch), launched.shape, overlapped, prepare_s=self.runner.last_prepare_s
        )


# Why a pooling engine refuses a request for what its model does not make, by what it makes.
_TASK_REFUSALS = {
    "embed": "This engine embeds prompts (--runner pooling) and neither generates text nor classifies; use "
    "/v1/embeddings, or /score and /rerank to compare texts (LLM.embed, LLM.score offline).",
    "classify": "This engine's model is a sequence classifier (--runner pooling): it neither generates text "
    "nor embeds; use /score, /rerank or /classify (LLM.score, LLM.classify offline).",
}


def _without_tokens(sample: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(index=sample.index, finish_reason=sample.finish_reason)
