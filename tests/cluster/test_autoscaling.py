"""Queue depth scales an InferenceService for real, through every piece a cluster would use.

A real runtime process runs the container the operator renders; Prometheus scrapes it under the
name of the kwok pod that stands for it; prometheus-adapter serves that series with the rules from
manifests/; the kube-controller-manager's HPA controller reads it through the aggregation layer
and scales the operator's Deployment up when requests queue and back down when they stop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from kube_objects import get, wait_for
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import selector_labels, variant_object_name
from pagoda_operator.plan import plan_service
from pagoda_operator.render import RenderOptions, render
from pagoda_runtime.contract.names import REQUESTS_WAITING as QUEUE_METRIC
from prometheus_process import PrometheusProcess, ensure_prometheus
from runtime_process import RuntimeProcess

pytestmark = pytest.mark.cluster

ADAPTER_RULES = Path(__file__).resolve().parents[2] / "manifests/monitoring/prometheus-adapter-rules.yaml"
NAME = "smol"
VARIANT = "cpu"
TARGET_QUEUE_DEPTH = 2
MAX_NUM_SEQS = 2
# Two run, ten wait: five times the target, so one pod's queue alone asks for more pods.
BURST = 12
# The two ways clusters find the runtime, and many run both: the operator's ServiceMonitor and the
# prometheus.io annotations on its pods. Every pod is then scraped twice.
SCRAPE_JOBS = ("service-monitor", "annotated-pods")
SPEC = {
    "model": {"source": "bundled://smollm2-135m", "family": "smollm2-135m", "maxModelLen": 1024},
    # A queue long enough for the whole burst: the runtime's default bound (twice maxNumSeqs) would
    # answer most of it with 429.
    "runtime": {
        "maxNumSeqs": MAX_NUM_SEQS,
        "maxNumBatchedTokens": 1024,
        "kvCacheMemory": 200 * 2**20,
        "maxQueue": BURST,
    },
    # Two at most: scale-down removes one pod a minute, and one step keeps the test short.
    "variants": [{"name": VARIANT, "replicas": {"min": 1, "max": 2}}],
    "resources": {"gpus": 0, "cpu": "1", "memory": "3Gi"},
    "autoscaling": {"targetQueueDepth": TARGET_QUEUE_DEPTH, "scaleDownStabilizationSeconds": 5},
    # The loopback cluster's only node is a tainted GPU node; these CPU pods may run there.
    "scheduling": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}


class LoadBurst:
    """Concurrent streaming completions held open until stop(), which disconnects them all."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.count = count
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    def __enter__(self) -> LoadBurst:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(timeout=None) as client:

            async def one() -> None:
                async with client.stream("POST", self.url + "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass

            tasks = [asyncio.create_task(one()) for _ in range(self.count)]
            self._started.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary, why = ensure_prometheus()
    if binary is None:
        pytest.skip(f"needs a prometheus binary, and it could not be installed: {why}")
    return binary


@pytest.fixture
def namespace(control_plane):
    ns = f"autoscale-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", ns)
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


@pytest.fixture
def rendered(namespace) -> list[dict]:
    spec = InferenceServiceSpec.model_validate(SPEC)
    objects = render(
        plan_service(spec), namespace=namespace, name=NAME, uid=str(uuid.uuid4()), options=RenderOptions()
    )
    for obj in objects:
        # No InferenceService exists here to own them, and the garbage collector deletes
        # dependents whose owner is missing.
        del obj["metadata"]["ownerReferences"]
    return objects


@pytest.fixture
def runtime(rendered, tmp_path):
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    process = RuntimeProcess(deployment["spec"]["template"]["spec"]["containers"][0], tmp_path)
    yield process
    process.stop()


def _running_pods(cp, namespace: str) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(NAME, VARIANT).items())
    pods = get(cp, "pods", "-n", namespace, "-l", selector)["items"]
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


@pytest.fixture
def metered_pod(control_plane, namespace, rendered) -> str:
    """The kwok pod the runtime process stands for: the one pod the Deployment starts with."""
    control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rendered})
    )
    return wait_for(
        lambda: _running_pods(control_plane, namespace),
        check=bool,
        timeout=60,
        what="the first pod to run",
        interval=1.0,
    )[0]


@pytest.fixture
def prometheus(prometheus_binary, runtime, metered_pod, namespace, tmp_path):
    target = {f"127.0.0.1:{runtime.port}": {"namespace": namespace, "pod": metered_pod}}
    jobs = dict.fromkeys(SCRAPE_JOBS, target)
    work_dir = tmp_path / "prometheus"
    work_dir.mkdir()
    process = PrometheusProcess(prometheus_binary, jobs, work_dir)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture
def custom_metrics(control_plane, prometheus):
    rules = yaml.safe_load(ADAPTER_RULES.read_text())["data"]["config.yaml"]
    control_plane.start_prometheus_adapter(prometheus.url, rules)
    yield
    control_plane.stop_prometheus_adapter()


def _pod_metrics(cp, namespace: str) -> dict[str, float]:
    path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{QUEUE_METRIC}"
    result = cp.kubectl("get", "--raw", path, check=False)
    if result.returncode != 0:
        return {}
    items = json.loads(result.stdout)["items"]
    return {item["describedObject"]["name"]: _quantity(item["value"]) for item in items}


def _quantity(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def _replicas(cp, namespace: str) -> int:
    return get(cp, "deployment", "-n", namespace, variant_object_name(NAME, VARIANT))["spec"]["replicas"]


def _hpa_current(cp, namespace: str) -> float | None:
    status = get(cp, "hpa", "-n", namespace, variant_object_name(NAME, VARIANT)).get("status", {})
    for current in status.get("currentMetrics") or []:
        if current.get("type") == "Pods" and current["pods"]["metric"]["name"] == QUEUE_METRIC:
            return _quantity(current["pods"]["current"]["averageValue"])
    return None


def test_queue_depth_scales_the_deployment_up_and_back_down(
    control_plane, namespace, runtime, metered_pod, prometheus, custom_metrics
):
    cp = control_plane
    runtime.wait_ready()
    idle = wait_for(
        lambda: _pod_metrics(cp, namespace),
        check=bool,
        timeout=60,
        what=f"{QUEUE_METRIC} in the custom metrics API",
        interval=1.0,
    )
    assert idle == {metered_pod: 0.0}
    # The HPA reads the idle queue (so the pipeline works before any load) and keeps one pod.
    wait_for(
        lambda: _hpa_current(cp, namespace),
        check=lambda v: v == 0,
        timeout=60,
        what="the HPA to read the idle queue depth",
        interval=1.0,
    )
    assert _replicas(cp, namespace) == 1

    with LoadBurst(runtime.url, BURST) as burst:
        queued = BURST - MAX_NUM_SEQS
        wait_for(
            lambda: runtime.metric(QUEUE_METRIC),
            check=lambda v: v == queued,
            timeout=60,
            what="the burst to queue",
            interval=0.2,
        )
        scraped = f"{QUEUE_METRIC} == {queued}"
        wait_for(
            lambda: prometheus.query(scraped),
            check=lambda r: len(r) == len(SCRAPE_JOBS),
            timeout=30,
            what="every scrape",
            interval=1.0,
        )
        # What the HPA sees is the pod's own queue, however many times Prometheus scraped it.
        assert _pod_metrics(cp, namespace) == {metered_pod: queued}
        wait_for(
            lambda: _replicas(cp, namespace),
            check=lambda n: n == 2,
            timeout=60,
            what="the HPA to scale the Deployment up",
            interval=1.0,
        )
        wait_for(
            lambda: _running_pods(cp, namespace),
            check=lambda pods: len(pods) == 2,
            timeout=60,
            what="the second pod to run",
            interval=1.0,
        )
        burst.stop()
        wait_for(
            lambda: runtime.metric(QUEUE_METRIC),
            check=lambda v: v == 0,
            timeout=30,
            what="the queue to empty",
            interval=0.2,
        )

    wait_for(
        lambda: _replicas(cp, namespace),
        check=lambda n: n == 1,
        timeout=90,
        what="the HPA to scale the Deployment back down",
        interval=1.0,
    )
    wait_for(
        lambda: _running_pods(cp, namespace),
        check=lambda pods: len(pods) == 1,
        timeout=60,
        what="the extra pod to go",
        interval=1.0,
    )
