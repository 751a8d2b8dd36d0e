"""Prometheus metrics under the names the operator and the dashboards use (contract/names.py),
labelled by model_name.

Engine state (queue depth, running, KV usage, prefix cache counters) is read from engine.stats()
at scrape time, so the numbers the autoscaler sees are never stale. Per-request latencies and
token counts are observed by the server from the timings each RequestOutput carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pagoda_runtime.contract.names import (
    E2E_REQUEST_LATENCY,
    FAILED_STEPS,
    FINISH_REASON_LABEL,
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    LORA_NAME_LABEL,
    LORA_REQUESTS,
    LORA_REQUESTS_INFO,
    MAX_LORA_LABEL,
    MODEL_NAME_LABEL,
    POSITION_LABEL,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PRIORITY_LABEL,
    PROMPT_TOKENS,
    REJECT_REASON_LABEL,
    REQUEST_DECODE_TIME,
    REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS,
    REQUEST_PREFILL_TIME,
    REQUEST_PROMPT_TOKENS,
    REQUEST_QUEUE_TIME,
    REQUEST_TIME_PER_OUTPUT_TOKEN,
    REQUESTS_FINISHED,
    REQUESTS_REJECTED,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    REQUESTS_WAITING_BY_PRIORITY,
    RUNNING_LORA_ADAPTERS_LABEL,
    SPEC_DECODE_ACCEPTED_PER_POSITION,
    SPEC_DECODE_ACCEPTED_TOKENS,
    SPEC_DECODE_DRAFT_TOKENS,
    SPEC_DECODE_DRAFTS,
    TIME_TO_FIRST_TOKEN,
    WAITING_LORA_ADAPTERS_LABEL,
)
from pagoda_runtime.engine.outputs import RequestOutput

_TTFT_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_REQUEST_BUCKETS = (
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
# Priority values with a series of their own, most urgent first; clients choose priorities, so
# the rest share one series ("other") to keep the number of series bounded.
MAX_PRIORITY_SERIES = 8

# vLLM's buckets for the per-request phase times and the mean time per output token.
_PHASE_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


def one_two_five_buckets(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to limit: vLLM's buckets for token counts up to max_model_len."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return tuple(float(b) for b in buckets)
            buckets.append(mantissa * scale)
        scale *= 10


# A request with any aborted sample was aborted; otherwise "length" says it was cut short.
_FINISH_PRIORITY = ("abort", "length", "stop")


class _EngineStatsCollector:
    def __init__(self, model_name: str, stats: Callable[[], object | None]) -> None:
        self.model_name = model_name
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self.stats()
        if stats is None:
            return
        gauges = (
            (REQUESTS_WAITING, "Requests waiting to be scheduled.", stats.num_waiting),
            (REQUESTS_RUNNING, "Requests in the running batch.", stats.num_running),
            (
                KV_CACHE_USAGE,
                "Fraction of KV cache blocks in use (0 to 1).",
                stats.kv_cache_usage,
            ),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=[MODEL_NAME_LABEL])
            gauge.add_metric([self.model_name], value)
            yield gauge
        yield self._waiting_by_priority(stats.waiting_by_priority)
        counters = (
            (
                PREFIX_CACHE_QUERIES,
                "Prompt tokens looked up in the prefix cache.",
                stats.prefix_cache_queries,
            ),
            (PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            (PREEMPTIONS, "Sequences preempted for lack of KV cache.", stats.num_preemptions),
            (
                FAILED_STEPS,
                "Engine steps that raised: their requests failed with an internal error, the rest went on.",
                stats.num_failed_steps,
            ),
        )
        spec = stats.spec_decode
        if spec is not None:
            counters += (
                (SPEC_DECODE_DRAFTS, "Drafts verified (speculative decoding).", spec.num_drafts),
                (SPEC_DECODE_DRAFT_TOKENS, "Draft tokens verified.", spec.num_draft_tokens),
                (SPEC_DECODE_ACCEPTED_TOKENS, "Draft tokens accepted.", spec.num_accepted_tokens),
            )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=[MODEL_NAME_LABEL])
            counter.add_metric([self.model_name], value)
            yield counter
        if spec is not None:
            per_position = CounterMetricFamily(
                SPEC_DECODE_ACCEPTED_PER_POSITION,
                "Draft tokens accepted at each position of their draft.",
                labels=[MODEL_NAME_LABEL, POSITION_LABEL],
            )
            for position, accepted in enumerate(spec.accepted_per_position):
                per_position.add_metric([self.model_name, str(position)], accepted)
            yield per_position
        if stats.max_lora:
            labels = [
                MODEL_NAME_LABEL,
                MAX_LORA_LABEL,
                WAITING_LORA_ADAPTERS_LABEL,
                RUNNING_LORA_ADAPTERS_LABEL,
            ]
            info = GaugeMetricFamily(
                LORA_REQUESTS_INFO,
                "LoRA adapters of the running and the waiting requests and --max-loras; the value is the "
                "time of the scrape, as vLLM sets it.",
                labels=labels,
            )
            waiting, running = ",".join(stats.waiting_lora_adapters), ",".join(stats.running_lora_adapters)
            info.add_metric([self.model_name, str(stats.max_lora), waiting, running], time.time())
            yield info

    def _waiting_by_priority(self, counts: tuple[tuple[int, int], ...]) -> Metric:
        gauge = GaugeMetricFamily(
            REQUESTS_WAITING_BY_PRIORITY,
            "Requests waiting to be scheduled, by the request field priority (lower is more urgent).",
            labels=[MODEL_NAME_LABEL, PRIORITY_LABEL],
        )
        # The default priority always has a series, so a query on it never finds none.
        by_priority = sorted({0: 0, **dict(counts)}.items())
        for priority, count in by_priority[:MAX_PRIORITY_SERIES]:
            gauge.add_metric([self.model_name, str(priority)], count)
        if len(by_priority) > MAX_PRIORITY_SERIES:
            rest = sum(count for _, count in by_priority[MAX_PRIORITY_SERIES:])
            gauge.add_metric([self.model_name, "other"], rest)
        return gauge


class ServerMetrics:
    def __init__(self, model_name: str, stats: Callable[[], object | None]) -> None:
        self.model_name = model_name
        # A registry per app, so that tests can build several apps in one process.
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_EngineStatsCollector(model_name, stats))
        labels = [MODEL_NAME_LABEL]
        reg = self.registry
        self.prompt_tokens = Counter(PROMPT_TOKENS, "Prompt tokens processed.", labels, registry=reg)
        self.generation_tokens = Counter(GENERATION_TOKENS, "Tokens generated.", labels, registry=reg)
        self.requests = Counter(
            REQUESTS_FINISHED,
            "Finished requests by finish reason.",
            [*labels, FINISH_REASON_LABEL],
            registry=reg,
        )
        self.lora_requests = Counter(
            LORA_REQUESTS,
            "Finished requests per LoRA adapter.",
            [*labels, LORA_NAME_LABEL],
            registry=reg,
        )
        self.rejected = Counter(
            REQUESTS_REJECTED,
            "Requests refused before reaching the engine.",
            [*labels, REJECT_REASON_LABEL],
            registry=reg,
        )
        self.ttft = Histogram(
            TIME_TO_FIRST_TOKEN,
            "Time to first token.",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            INTER_TOKEN_LATENCY,
            "Time between tokens.",
            labels,
            buckets=_ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            E2E_REQUEST_LATENCY,
            "Arrival to last token.",
            labels,
            buckets=_REQUEST_BUCKETS,
            registry=reg,
        )
        self.queue_time = Histogram(
            REQUEST_QUEUE_TIME,
            "Arrival to first scheduled.",
            labels,
            buckets=_REQUEST_BUCKETS,
            registry=reg,
        )

        self.prefill_time = Histogram(
            REQUEST_PREFILL_TIME,
            "First scheduled to first token.",
            labels,
            buckets=_PHASE_BUCKETS,
            registry=reg,
        )
        self.decode_time = Histogram(
            REQUEST_DECODE_TIME,
            "First token to last token.",
            labels,
            buckets=_PHASE_BUCKETS,
            registry=reg,
        )
        self.time_per_output_token = Histogram(
            REQUEST_TIME_PER_OUTPUT_TOKEN,
            "Mean time per output token after the first, per request.",
            labels,
            buckets=_TPOT_BUCKETS,
            registry=reg,
        )
        # Their buckets run up to the model's context length, known once the engine has loaded.
        self.token_lengths: tuple[Histogram, Histogram, Histogram] | None = None

    def engine_loaded(self, max_model_len: int) -> None:
        """Registers the token-length histograms, whose buckets stop at max_model_len."""
        if self.token_lengths is not None:
            return
        buckets, labels, reg = one_two_five_buckets(max_model_len), [MODEL_NAME_LABEL], self.registry
        self.token_lengths = tuple(
            Histogram(name, doc, labels, buckets=buckets, registry=reg)
            for name, doc in (
                (REQUEST_PROMPT_TOKENS, "Prompt tokens per request."),
                (REQUEST_GENERATION_TOKENS, "Generated tokens per request."),
                (REQUEST_MAX_GENERATION_TOKENS, "The max_tokens each request allowed."),
            )
        )

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def token_gap(self, seconds: float, num_tokens: int) -> None:
        """One step delivered num_tokens new tokens per sample, seconds after the previous one."""
        child = self.itl.labels(self.model_name)
        for _ in range(num_tokens):
            child.observe(seconds / num_tokens)

    def ended(self, generated_tokens: int, prompt_len: int, reason: str) -> None:
        """A request that ended before the engine finished it, after generated_tokens (all samples):
        "abort" when its client went away, "error" when a step that ran it failed."""
        self.prompt_tokens.labels(self.model_name).inc(prompt_len)
        self.generation_tokens.labels(self.model_name).inc(generated_tokens)
        self.requests.labels(self.model_name, reason).inc()

    def finished(self, out: RequestOutput, max_tokens: int, lora_name: str | None = None) -> None:
        """max_tokens: the most the request allowed (its max_tokens, or what the context left)."""
        name = self.model_name
        if lora_name is not None:
            self.lora_requests.labels(name, lora_name).inc()
        m = out.metrics
        generated = sum(len(o.token_ids) for o in out.outputs)
        self.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(name).inc(generated)
        if self.token_lengths is not None:
            for histogram, value in zip(
                self.token_lengths, (len(out.prompt_token_ids), generated, max_tokens), strict=True
            ):
                histogram.labels(name).observe(value)
        if m.first_token_time is not None and m.first_scheduled_time is not None:
            self.prefill_time.labels(name).observe(m.first_token_time - m.first_scheduled_time)
        if m.first_token_time is not None and m.last_token_time is not None:
            decode = m.last_token_time - m.first_token_time
            self.decode_time.labels(name).observe(decode)
            steps = max((len(o.token_ids) for o in out.outputs), default=0) - 1
            self.time_per_output_token.labels(name).observe(decode / steps if steps > 0 else 0.0)
        reasons = {o.finish_reason for o in out.outputs}
        reason = next((r for r in _FINISH_PRIORITY if r in reasons), "stop")
        self.requests.labels(name, reason).inc()
        if m.first_token_time is not None:
            self.ttft.labels(name).observe(m.first_token_time - m.arrival_time)
        if m.first_scheduled_time is not None:
            self.queue_time.labels(name).observe(m.first_scheduled_time - m.arrival_time)
        end = m.finished_time or m.last_token_time
        if end is not None:
            self.e2e.labels(name).observe(end - m.arrival_time)
