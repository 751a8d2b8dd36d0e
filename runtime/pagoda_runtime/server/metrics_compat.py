"""`--metrics-compat vllm`: the same measurements exported a second time under vLLM's names, so
that dashboards and KEDA/HPA rules written for vLLM keep working on Pagoda unchanged.

The copies are made at scrape time from Pagoda's own families; there is one measurement, two names.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

METRICS_COMPAT_CHOICES = ("vllm",)

# Pagoda family -> vLLM families (v1 names first, then the older names dashboards still query).
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "pagoda_num_requests_waiting": ("vllm:num_requests_waiting",),
    "pagoda_num_requests_running": ("vllm:num_requests_running",),
    "pagoda_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "pagoda_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "pagoda_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "pagoda_num_preemptions": ("vllm:num_preemptions",),
    "pagoda_prompt_tokens": ("vllm:prompt_tokens",),
    "pagoda_generation_tokens": ("vllm:generation_tokens",),
    "pagoda_requests": ("vllm:request_success",),
    "pagoda_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "pagoda_inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "pagoda_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "pagoda_request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
}
# vLLM spells this label differently.
_LABELS = {"finish_reason": "finished_reason"}


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
