"""The names both sides of the pod boundary use (contract/names.py): the server exports exactly those
metrics, and the monitoring manifests (adapter rules, dashboard) and the architecture notes ask
only for metrics and labels it exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pagoda_operator.metrics import RESULT_LABEL
from pagoda_operator.names import PROMETHEUS_ISVC_LABEL, PROMETHEUS_VARIANT_LABEL
from pagoda_runtime.contract import names
from pagoda_runtime.engine.stats import EngineStats, SpecDecodeCounts
from pagoda_runtime.server.metrics import ServerMetrics

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "manifests" / "monitoring"
# The runtime's families as scraped: counters gain _total, histograms _bucket, _sum and _count.
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
# Labels Prometheus attaches itself (the scrape target and its pod's labels, a histogram's bound).
_TARGET_LABELS = {"pod", "namespace", "le", PROMETHEUS_ISVC_LABEL, PROMETHEUS_VARIANT_LABEL}


def _runtime_metrics(text: str) -> set[str]:
    """The runtime metric families a text names (the operator's own pagoda_operator_* and the pod-label
    target labels pagoda_dev_* left out)."""
    found = set()
    for name in re.findall(r"\bpagoda_(?!operator|runtime|dev_)[a-z0-9_]+", text):
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in names.METRICS:
                name = name.removesuffix(suffix)
        found.add(name)
    return found


def _exported() -> set[str]:
    stats = EngineStats(
        num_waiting=1,
        num_running=2,
        kv_cache_usage=0.5,
        prefix_cache_queries=4,
        prefix_cache_hits=3,
        num_preemptions=0,
        spec_decode=SpecDecodeCounts(1, 3, 2, (1, 1, 0)),
        max_lora=2,  # LoRA's families are exported with --enable-lora only
    )
    metrics = ServerMetrics("m", lambda: stats)
    metrics.engine_loaded(max_model_len=4096)  # the token-length families, once a model has loaded
    registry = metrics.registry
    return {family.name for family in registry.collect() if family.name.startswith(("pagoda_", "vllm:"))}


def test_the_server_exports_every_shared_metric_name_and_no_other():
    assert _exported() == set(names.METRICS + names.SPEC_DECODE_METRICS)


def test_the_monitoring_manifests_ask_for_exported_metrics_and_labels():
    dashboard = (MONITORING / "grafana-dashboard.json").read_text()
    adapter = (MONITORING / "prometheus-adapter-rules.yaml").read_text()
    used = _runtime_metrics(dashboard) | _runtime_metrics(adapter)
    assert used and used <= set(names.METRICS), used - set(names.METRICS)
    # The adapter serves the queue depth under the name the operator's HPAs ask for.
    rules = yaml.safe_load(yaml.safe_load(adapter)["data"]["config.yaml"])["rules"]
    assert {rule["name"]["as"] for rule in rules} == {names.REQUESTS_WAITING}
    grouped = set(re.findall(r"by \(([a-z_]+)\)", dashboard))
    shared = {names.MODEL_NAME_LABEL, names.FINISH_REASON_LABEL, names.REJECT_REASON_LABEL}
    shared.add(RESULT_LABEL)  # the operator's own reconcile counter
    assert grouped <= shared | _TARGET_LABELS, grouped - shared - _TARGET_LABELS


def test_the_architecture_notes_name_exported_metrics():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert _runtime_metrics(text) <= set(names.METRICS), _runtime_metrics(text) - set(names.METRICS)
