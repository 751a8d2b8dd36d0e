"""The operator's own Prometheus metrics, served by `pagoda-operator --metrics-port`."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RESULT_LABEL = "result"  # of RECONCILES: ok, invalid, error
RECONCILES = Counter(
    "pagoda_operator_reconciles_total", "InferenceService reconciliations by result.", [RESULT_LABEL]
)
RECONCILE_SECONDS = Histogram(
    "pagoda_operator_reconcile_duration_seconds", "Time to apply one InferenceService's children."
)
STATUS_WRITES = Counter("pagoda_operator_status_writes_total", "InferenceService status patches written.")
