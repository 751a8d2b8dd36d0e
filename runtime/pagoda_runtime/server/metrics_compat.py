"""`--metrics-compat vllm`: the same measurements exported a second time under vLLM's names, so
that dashboards and KEDA/HPA rules written for vLLM keep working on Pagoda unchanged.

The copies are made at scrape time from Pagoda's own families; there is one measurement, two names.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from pagoda_runtime.contract import names as n

# Pagoda family -> vLLM families (v1 names first, then the older names dashboards still query).
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    n.REQUESTS_WAITING: ("vllm:num_requests_waiting",),
    n.REQUESTS_RUNNING: ("vllm:num_requests_running",),
    n.KV_CACHE_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    n.PREFIX_CACHE_QUERIES: ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    n.PREFIX_CACHE_HITS: ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    n.PREEMPTIONS: ("vllm:num_preemptions",),
    n.PROMPT_TOKENS: ("vllm:prompt_tokens",),
    n.GENERATION_TOKENS: ("vllm:generation_tokens",),
    n.REQUESTS_FINISHED: ("vllm:request_success",),
    n.TIME_TO_FIRST_TOKEN: ("vllm:time_to_first_token_seconds",),
    n.INTER_TOKEN_LATENCY: (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    n.E2E_REQUEST_LATENCY: ("vllm:e2e_request_latency_seconds",),
    n.REQUEST_QUEUE_TIME: ("vllm:request_queue_time_seconds",),
    n.LORA_REQUESTS_INFO: ("vllm:lora_requests_info",),
    n.REQUEST_TIME_PER_OUTPUT_TOKEN: ("vllm:request_time_per_output_token_seconds",),
    n.REQUEST_PREFILL_TIME: ("vllm:request_prefill_time_seconds",),
    n.REQUEST_DECODE_TIME: ("vllm:request_decode_time_seconds",),
    n.REQUEST_PROMPT_TOKENS: ("vllm:request_prompt_tokens",),
    n.REQUEST_GENERATION_TOKENS: ("vllm:request_generation_tokens",),
    n.REQUEST_MAX_GENERATION_TOKENS: ("vllm:request_max_num_generation_tokens",),
}
# vLLM spells this label differently.
_LABELS = {n.FINISH_REASON_LABEL: "finished_reason"}


class VllmNamedCollector:
    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        for family in self.source.collect():
            for name in VLLM_NAMES.get(family.name, ()):
                copy = Metric(name, family.documentation, family.type, family.unit)
                copy.samples = [
                    Sample(
                        name + sample.name[len(family.name) :],
                        {_LABELS.get(k, k): v for k, v in sample.labels.items()},
                        sample.value,
                        sample.timestamp,
                        sample.exemplar,
                    )
                    for sample in family.samples
                ]
                yield copy


def vllm_registry(source: CollectorRegistry) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmNamedCollector(source))
    return registry
