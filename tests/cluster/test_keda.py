"""KEDA scales an InferenceService's variant for real: the ScaledObject the operator renders, KEDA's
operator and metrics server built from the pinned module, Prometheus scraping a real runtime (as in
test_autoscaling.py) and a real Traefik serving the HTTPRoute.

- 1 → 2 → 1: a queue on the runtime raises the KEDA-made HPA's count, and it falls back when the
  queue empties.
- 1 → 0 → 1: idle past scaleToZeroAfterSeconds, the variant goes to zero pods; requests at the
  gateway then get 503 with Retry-After (never a connection error) and are counted by Traefik, and
  that count wakes the variant.

The kwok pods here have no network behind them, so in the scale-to-zero test the variant's Service
selects nothing: Traefik never has an address to send a request to, and sees every request as one
for a backend without a ready pod. The wake-up with the request served runs on real pods in
tests/e2e/test_gateway.py.
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
from kube_objects import get, get_or_none, wait_for
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import selector_labels, variant_object_name
from pagoda_operator.plan import plan_service
from pagoda_operator.render import RenderOptions, render
from pagoda_operator.settings import KedaSettings
from pagoda_runtime.contract.names import REQUESTS_WAITING as QUEUE_METRIC
from prometheus_process import PrometheusProcess, ensure_prometheus
from runtime_process import RuntimeProcess
from test_autoscaling import BURST, MAX_NUM_SEQS, SPEC, TARGET_QUEUE_DEPTH, LoadBurst

pytestmark = pytest.mark.cluster

NAME, VARIANT = "smol", "cpu"
DEPLOYMENT = variant_object_name(NAME, VARIANT)
IDLE_SECONDS = 5
# The smallest startup timeout the spec takes: KEDA's initialCooldownPeriod, the wait before a
# freshly created variant may first go to zero.
STARTUP_SECONDS = 60


@pytest.fixture(scope="module")
def keda(control_plane):
    if not all(controlplane_binary(n) for n in ("keda-operator", "keda-adapter")):
        pytest.skip("KEDA is not built: e2e/controlplane/build.sh keda-operator keda-adapter")
    control_plane.start_keda()
    yield
    control_plane.stop_keda()


@pytest.fixture(scope="module")
def gateway(control_plane):
    if not controlplane_binary("traefik"):
        pytest.skip("Traefik is not built: e2e/controlplane/build.sh traefik")
    gw = control_plane.start_traefik(namespace="keda-gateway", hold_seconds=0, retry_after_seconds=2)
    yield gw
    control_plane.stop_traefik()


def controlplane_binary(name: str) -> bool:
    from repo_modules import controlplane

    return controlplane.binary_path(name).exists()


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary, why = ensure_prometheus()
    if binary is None:
        pytest.skip(f"needs a prometheus binary, and it could not be installed: {why}")
    return binary


@pytest.fixture
def namespace(control_plane):
    ns = f"keda-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", ns)
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


def _rendered(spec: dict, namespace: str, prometheus_url: str, gateway_api: bool = False) -> list[dict]:
    objects = render(
        plan_service(InferenceServiceSpec.model_validate(spec)),
        namespace=namespace,
        name=NAME,
        uid=str(uuid.uuid4()),
        options=RenderOptions(keda=KedaSettings(prometheus_url=prometheus_url), gateway_api=gateway_api),
    )
    for obj in objects:
        del obj["metadata"]["ownerReferences"]  # no InferenceService here to own them
    return objects


def _apply(cp, objects: list[dict]) -> None:
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def _replicas(cp, namespace: str) -> int:
    return get(cp, "deployment", "-n", namespace, DEPLOYMENT)["spec"].get("replicas", 1)


def _running_pods(cp, namespace: str) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(NAME, VARIANT).items())
    pods = get(cp, "pods", "-n", namespace, "-l", selector)["items"]
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def test_queue_depth_scales_the_variant_up_and_back_down_through_keda(
    control_plane, keda, prometheus_binary, namespace, tmp_path
):
    cp = control_plane
    (prom_dir := tmp_path / "prometheus").mkdir()
    objects = _rendered(SPEC, namespace, "http://placeholder")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    runtime = RuntimeProcess(deployment["spec"]["template"]["spec"]["containers"][0], tmp_path)
    try:
        _apply(cp, [o for o in objects if o["kind"] != "ScaledObject"])
        pod = wait_for(lambda: _running_pods(cp, namespace), check=bool, timeout=60, what="the first pod")[0]
        target = {f"127.0.0.1:{runtime.port}": {"namespace": namespace, "pod": pod}}
        prometheus = PrometheusProcess(prometheus_binary, {"pods": target}, prom_dir)
        try:
            prometheus.wait_ready()
            runtime.wait_ready()
            _apply(cp, [o for o in _rendered(SPEC, namespace, prometheus.url) if o["kind"] == "ScaledObject"])
            hpa = f"keda-hpa-{DEPLOYMENT}"
            wait_for(
                lambda: ((get_or_none(cp, "hpa", "-n", namespace, hpa) or {}).get("status") or {}).get(
                    "currentMetrics"
                ),
                check=bool,
                timeout=120,
                what="the HPA KEDA made to read the queue depth",
                interval=1.0,
            )
            assert _replicas(cp, namespace) == 1
            with LoadBurst(runtime.url, BURST) as burst:
                queued = BURST - MAX_NUM_SEQS
                wait_for(
                    lambda: runtime.metric(QUEUE_METRIC),
                    check=lambda v: v == queued,
                    timeout=60,
                    what="a queue",
                )
                assert queued > TARGET_QUEUE_DEPTH
                wait_for(
                    lambda: _replicas(cp, namespace), check=lambda n: n == 2, timeout=90, what="2 replicas"
                )
                wait_for(
                    lambda: len(_running_pods(cp, namespace)),
                    check=lambda n: n == 2,
                    timeout=60,
                    what="2 pods",
                )
                burst.stop()
            wait_for(lambda: _replicas(cp, namespace), check=lambda n: n == 1, timeout=120, what="back to 1")
        finally:
            prometheus.stop()
    finally:
        runtime.stop()


def test_an_idle_variant_goes_to_zero_and_requests_at_the_gateway_wake_it(
    control_plane, keda, gateway, prometheus_binary, namespace, tmp_path
):
    cp = control_plane
    spec = {
        **SPEC,
        "variants": [{"name": VARIANT, "replicas": {"min": 0, "max": 1}}],
        "route": {"gatewayRef": {"name": gateway.name, "namespace": gateway.namespace}},
        "autoscaling": {"scaleToZeroAfterSeconds": IDLE_SECONDS, "pollingIntervalSeconds": 1},
        "runtime": {**SPEC["runtime"], "startupTimeoutSeconds": STARTUP_SECONDS},
    }
    (prom_dir := tmp_path / "prometheus").mkdir()
    traefik = httpx.URL(gateway.metrics_url)
    prometheus = PrometheusProcess(
        prometheus_binary,
        {"traefik": {f"{traefik.host}:{traefik.port}": {"job": "traefik"}}},
        prom_dir,
    )
    try:
        prometheus.wait_ready()
        objects = _rendered(spec, namespace, prometheus.url, gateway_api=True)
        for obj in objects:
            if obj["kind"] == "Service":
                # No address to send to (see the module's docstring): every request finds no pod.
                obj["spec"]["selector"] = {"pagoda.dev/nothing": "here"}
            if obj["kind"] == "Deployment":
                obj["spec"]["replicas"] = 1  # as the operator creates it (replicas.py)
        _apply(cp, objects)
        wait_for(lambda: _running_pods(cp, namespace), check=bool, timeout=60, what="the first pod")
        started = time.monotonic()
        wait_for(
            lambda: _replicas(cp, namespace),
            check=lambda n: n == 0,
            timeout=STARTUP_SECONDS + 90,
            what="zero",
        )
        # Not before the startup timeout: a first model load is never taken for idleness.
        assert time.monotonic() - started >= STARTUP_SECONDS - 5
        wait_for(lambda: _running_pods(cp, namespace), check=lambda p: p == [], timeout=60, what="no pod")

        base = f"{gateway.url}/{NAME}/{VARIANT}/v1"
        answers = []
        woke_at = None
        asked_at = time.monotonic()
        deadline = asked_at + 90
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < deadline and _replicas(cp, namespace) == 0:
                r = client.post(base + "/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 1})
                answers.append((r.status_code, r.headers.get("retry-after")))
                time.sleep(0.5)
            if _replicas(cp, namespace) == 1:
                woke_at = time.monotonic()
        assert woke_at is not None, f"the variant did not wake within 90 s; answers {answers[-3:]}"
        assert answers and all(status == 503 and retry == "2" for status, retry in answers), answers
        wait_for(lambda: _running_pods(cp, namespace), check=bool, timeout=60, what="the woken pod")
        print(f"gateway demand woke the variant {woke_at - asked_at:.1f}s after the first request")
    finally:
        prometheus.stop()
