"""A test double of the engine contract (engine_protocol.ServingEngine), for fast tests of the HTTP
layer alone.

It "generates" a fixed text character by character (one token per character), so tests can
predict text, token counts, stops and lengths without a model. The real engine is exercised by
the tests that start `pagoda-runtime serve` with the bundled model.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.memory_report import MemoryReport
from pagoda_runtime.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from pagoda_runtime.engine.protocol import LoraNotFound, ServedLora
from pagoda_runtime.engine.request_validation import RequestRejected, check_priority, check_request
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.stats import EngineStats, SpecDecodeCounts

SCRIPT = "the quick brown fox jumps over the lazy dog. " * 20
EOS = 0


class FakeTokenizer:
    """One token per character: id = code point (below 256)."""

    vocab_size = 256
    special_tokens: frozenset[str] = frozenset()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 256 for c in text]

    def encode_pair(self, first: str, second: str) -> list[int]:
        return self.encode(first) + self.encode(second)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    # Set by the server's --chat-template; the fake has no Jinja and "renders" it verbatim.
    chat_template: str | None = None

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **variables,
    ) -> str:
        if self.chat_template is not None:
            return self.chat_template
        rendered = "".join(f"<tools>{','.join(t['function']['name'] for t in tools)}\n" for _ in [1] if tools)
        rendered += "".join(f"<{name}={value}>\n" for name, value in sorted(variables.items()))
        for m in messages:
            calls = "".join(
                f"<call>{c['function']['name']}({c['function']['arguments']})"
                for c in m.get("tool_calls", ())
            )
            rendered += f"<{m['role']}>{m['content']}{calls}\n"
        return rendered + ("<assistant>" if add_generation_prompt else "")


@dataclass
class _Request:
    params: SamplingParams
    prompt_ids: list[int]
    priority: int = 0
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


def _prompt_scores(ids: list[int], params: SamplingParams) -> dict:
    """What the engine reports for SamplingParams.prompt_logprobs: each prompt token after the
    first the likeliest (logprob -0.5, rank 1), its next id the runner-up."""
    if params.prompt_logprobs is None:
        return {}
    entries = [{t: -0.5, (t + 1) % FakeTokenizer.vocab_size: -1.5} for t in ids[1:]]
    return {"prompt_logprobs": [None, *entries], "prompt_token_ranks": [None] + [1] * (len(ids) - 1)}


class FakeEngine:
    def __init__(
        self,
        max_model_len: int = 512,
        step_s: float = 0.005,
        max_running: int = 64,
        scheduling_policy: str = "fcfs",
    ) -> None:
        self.scheduling_policy = scheduling_policy
        self.pooling_task = None
        self.class_labels = ()
        self.tokenizer = FakeTokenizer()
        self.spec_decode: SpecDecodeCounts | None = None  # a test sets it to serve speculation's tallies
        self.vocab_size = FakeTokenizer.vocab_size
        self.memory = MemoryReport(
            model="fake-model",
            quantization="int4",
            dtype="bfloat16",
            kv_cache_dtype="fp8",
            weight_bytes=1000,
            predicted_weight_bytes=1024,
            kv_bytes_per_block=256,
            block_size=16,
            num_kv_blocks=10,
        )
        self.max_model_len = max_model_len
        # The model's recommended sampling, as a generation_config.json gives it (none by default).
        self.sampling_defaults: dict[str, float] = {}
        self.step_s = step_s
        self.max_running = max_running
        self.last_heartbeat = time.monotonic()
        self.errored: BaseException | None = None
        self.requests: dict[str, _Request] = {}
        self.internal_ids: set[str] = set()
        self.running: list[str] = []
        self.aborted_ids: list[str] = []
        # Of client requests, not canaries.
        self.seen_prompts: list[list[int]] = []
        self.seen_params: list[SamplingParams] = []
        self.seen_priorities: list[int] = []
        self.script = SCRIPT  # what every sample "generates", from its index on
        self.params_seen: list[SamplingParams] = []  # every request's, in arrival order
        self.adapters: dict[str, ServedLora] = {}  # served LoRA adapters; add_lora checks nothing
        self.seen_lora_names: list[str | None] = []
        self._ticker: asyncio.Task | None = None

    async def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            self.last_heartbeat = time.monotonic()
            await asyncio.sleep(0.05)

    async def shutdown(self) -> None:
        if self._ticker:
            self._ticker.cancel()

    def stats(self) -> EngineStats:
        running = [r for r in self.running if r not in self.internal_ids]
        waiting = Counter(
            r.priority for i, r in self.requests.items() if i not in self.internal_ids and i not in running
        )
        return EngineStats(
            num_waiting=waiting.total(),
            waiting_by_priority=tuple(sorted(waiting.items())),
            num_running=len(running),
            kv_cache_usage=len(running) / 64,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=0,
            spec_decode=self.spec_decode,
        )

    async def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is not None:
            self.aborted_ids.append(request_id)
            request.aborted.set()

    def abort_all(self) -> None:
        for request_id, request in self.requests.items():
            self.aborted_ids.append(request_id)
            request.aborted.set()

    def lora_adapters(self) -> dict[str, ServedLora]:
        return dict(self.adapters)

    async def add_lora(self, name: str, path: str) -> None:
        self.adapters[name] = ServedLora(None, path)

    async def remove_lora(self, name: str) -> None:
        if self.adapters.pop(name, 0) == 0:
            raise LoraNotFound(name)

    async def generate(
        self,
        prompt,
        params: SamplingParams,
        request_id: str,
        internal: bool = False,
        priority: int = 0,
        lora_name=None,
    ):
        if isinstance(params, PoolingParams):
            # As the real engine refuses it without --runner pooling (LLMEngine._run_as).
            raise RequestRejected(
                "This engine generates text; embeddings, scores and classes need one started with "
                "--runner pooling."
            )
        if internal:
            self.internal_ids.add(request_id)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_priority(priority, self.scheduling_policy)
        check_request(ids, params, FakeTokenizer.vocab_size, self.max_model_len)
        max_tokens = params.max_tokens or self.max_model_len - len(ids)
        if not internal:
            self.seen_lora_names.append(lora_name)
            self.seen_prompts.append(ids)
            self.seen_params.append(params)
            self.seen_priorities.append(priority)
        request = _Request(params, ids, priority)
        self.requests[request_id] = request
        self.params_seen.append(params)
        metrics = RequestMetrics(arrival_time=time.monotonic())
        outputs = [
            CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None)
            for i in range(params.n)
        ]
        try:
            while len(self.running) >= self.max_running and not request.aborted.is_set():
                await asyncio.sleep(self.step_s)
            self.running.append(request_id)
            metrics.first_scheduled_time = time.monotonic()
            step = 0
            while True:
                await asyncio.sleep(self.step_s)
                deltas = []
                for out in outputs:
                    if out.finish_reason is not None:
                        continue
                    delta = CompletionOutput(
                        index=out.index, logprobs=[] if out.logprobs is not None else None
                    )
                    if request.aborted.is_set():
                        out.finish_reason = delta.finish_reason = "abort"
                        deltas.append(delta)
                        continue
                    char = self.script[(step + out.index) % len(self.script)]
                    token = ord(char)
                    out.token_ids.append(token)
                    delta.token_ids.append(token)
                    out.text += char
                    delta.text = char
                    if out.logprobs is not None:
                        alternatives = {token: -0.25, (token + 1) % 256: -1.5, (token + 2) % 256: -3.0}
                        out.logprobs.append(alternatives)
                        delta.logprobs.append(alternatives)
                    hit = next((s for s in params.stop if out.text.endswith(s)), None)
                    if hit is not None:
                        out.text = out.text[: -len(hit)]
                        delta.text = delta.text[: max(0, len(delta.text) - len(hit))]
                        out.finish_reason = delta.finish_reason = "stop"
                        out.stop_reason = hit
                    elif len(out.token_ids) >= max_tokens:
                        out.finish_reason = delta.finish_reason = "length"
                    deltas.append(delta)
                now = time.monotonic()
                metrics.first_token_time = metrics.first_token_time or now
                metrics.last_token_time = now
                finished = all(o.finish_reason is not None for o in outputs)
                if finished:
                    metrics.finished_time = now
                whole = outputs if finished or params.output_kind == "cumulative" else []
                yield RequestOutput(
                    request_id,
                    None,
                    ids,
                    whole,
                    finished,
                    metrics,
                    delta=deltas,
                    **_prompt_scores(ids, params),
                )
                if finished:
                    return
                step += 1
        finally:
            self.requests.pop(request_id, None)
            if request_id in self.running:
                self.running.remove(request_id)
