"""Traffic through a real Gateway to real pods (the local provider): Traefik serving the HTTPRoute the
operator renders, KEDA scaling on Prometheus, both on the host beside the control plane.

One InferenceService with two variants of the CPU example, `a` (90 % of the shared path) and `b`
(10 %, scales to zero). In order: each variant is reached by its path and by its model name; the
split measured over 200 requests is 90/10 within 5 points; moving the weights while requests run
loses none and restarts no pod; `b`, idle, goes to zero pods, and the first request at zero gets
its first token once `b` has woken, through the OpenAI client's own retries. The time from that
request to its first token is printed, and written to $PAGODA_WAKE_RESULT when set.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from conftest import OPERATOR_NAMESPACE
from pagoda_operator.names import variant_object_name
from polling import wait_for
from providers import ROOT
from repo_modules import controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = "pagoda-gateway"
NAME = "smol"
SPLIT_REQUESTS = 200
IDLE_SECONDS = 15
# KEDA's initialCooldownPeriod: a variant is never taken to zero sooner after it was created.
STARTUP_SECONDS = 180


def _isvc(cluster, traffic: tuple[int, int]) -> dict:
    isvc = yaml.safe_load((ROOT / "manifests" / "examples" / "cpu-smollm2.yaml").read_text())
    isvc["metadata"]["name"] = NAME
    spec = isvc["spec"]
    spec["runtime"]["image"] = cluster.runtime_image
    spec["runtime"]["startupTimeoutSeconds"] = STARTUP_SECONDS
    spec["resources"]["cpu"] = "500m"
    spec["variants"] = [
        {"name": "a", "quantization": "none", "traffic": traffic[0]},
        {"name": "b", "quantization": "none", "traffic": traffic[1], "replicas": {"min": 0, "max": 1}},
    ]
    spec["route"] = {"gatewayRef": {"name": "gateway", "namespace": "gateway"}}
    spec["autoscaling"] = {"scaleToZeroAfterSeconds": IDLE_SECONDS, "pollingIntervalSeconds": 2}
    return isvc


@pytest.fixture(scope="module")
def gateway(cluster, installed):
    cp = getattr(cluster, "cp", None)
    if cp is None:
        pytest.skip(f"the {cluster.name} provider runs no Traefik or KEDA on its host")
    for binary in ("traefik", "keda-operator", "keda-adapter"):
        if not controlplane.binary_path(binary).exists():
            pytest.skip(f"{binary} is not built: e2e/controlplane/build.sh gateway")
    gw = cp.start_traefik(namespace="gateway")
    cp.start_keda()
    metrics = httpx.URL(gw.metrics_url)
    try:
        with cluster.prometheus({"traefik": f"{metrics.host}:{metrics.port}"}) as prometheus:
            # KEDA runs on this host, so the ScaledObjects point it at this Prometheus.
            cluster.kubectl(
                "-n", OPERATOR_NAMESPACE, "patch", "deployment", "pagoda-operator", "--type=json",
                "-p", json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
                                   "value": f"--prometheus-url={prometheus}"}]),
            )  # fmt: skip
            cluster.kubectl(
                "-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pagoda-operator", "--timeout=300s",
                timeout=330,
            )  # fmt: skip
            yield gw
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=180s", timeout=200)
        cp.stop_keda()
        cp.stop_traefik()


@pytest.fixture(scope="module")
def isvc(cluster, gateway) -> str:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(_isvc(cluster, (90, 10))))
    cluster.kubectl(
        "wait", "-n", NAMESPACE, f"infsvc/{NAME}", "--for=condition=Ready", "--timeout=600s", timeout=630
    )
    # Ready counts the variants that must serve; b, which may go to zero, starts with a pod all the
    # same, and the tests below ask it before it has had time to go idle.
    cluster.kubectl(
        "rollout", "status", "-n", NAMESPACE, f"deployment/{variant_object_name(NAME, 'b')}",
        "--timeout=600s", timeout=630,
    )  # fmt: skip
    cluster.kubectl(
        "wait",
        "-n",
        NAMESPACE,
        f"infsvc/{NAME}",
        "--for=condition=RouteAccepted",
        "--timeout=120s",
        timeout=150,
    )
    # Accepted is the route's parsing; the gateway serves it once it has read the Services' endpoints
    # too, and until then answers 503 with Retry-After as for a variant at zero.
    with httpx.Client(timeout=60) as client:
        for url in (f"{gateway.url}/{NAME}/{variant}/v1/models" for variant in ("a", "b")):
            wait_for(
                lambda url=url: client.get(url).status_code, check=lambda c: c == 200, timeout=120, what=url
            )
    return NAME


def _served_by(client: httpx.Client, url: str) -> str:
    """The variant whose pod answered: the NAME:VARIANT among the models it lists."""
    response = client.get(url + "/v1/models")
    response.raise_for_status()
    (variant,) = [m["id"].split(":", 1)[1] for m in response.json()["data"] if ":" in m["id"]]
    return variant


def test_each_variant_is_reached_by_its_path_and_by_its_model_name(cluster, gateway, isvc):
    with httpx.Client(timeout=60) as client:
        for variant in ("a", "b"):
            assert _served_by(client, f"{gateway.url}/{NAME}/{variant}") == variant
    shared = openai.OpenAI(base_url=f"{gateway.url}/{NAME}/v1", api_key="none", max_retries=5)
    for variant in ("a", "b"):
        # Whichever variant the split picks, a pod of the other one redirects to this one's path.
        for _ in range(4):
            done = shared.completions.create(model=f"{NAME}:{variant}", prompt="Hello", max_tokens=2)
            assert done.model == f"{NAME}:{variant}" and done.choices[0].text
    status = json.loads(cluster.kubectl("get", "infsvc", NAME, "-n", NAMESPACE, "-o", "json").stdout)[
        "status"
    ]
    listed = {v["name"]: v for v in status["variants"]}
    assert listed["b"]["path"] == f"/{NAME}/b" and listed["b"]["modelNames"] == [NAME, f"{NAME}:b"]
    assert listed["a"]["service"] == variant_object_name(NAME, "a")
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["RouteAccepted"] == "True" and conditions["RouteResolvedRefs"] == "True"


def test_a_90_10_split_holds_over_200_requests(gateway, isvc):
    with httpx.Client(timeout=120) as client:
        served = [_served_by(client, f"{gateway.url}/{NAME}") for _ in range(SPLIT_REQUESTS)]
    share = served.count("a") / len(served)
    print(f"variant a served {share:.1%} of {len(served)} requests (weight 90)")
    assert abs(share - 0.90) <= 0.05, served


def _pods(cluster, terminating: bool = False) -> dict[str, tuple[str, int]]:
    """Each pod's uid and restarts by name; with `terminating`, pods being deleted too."""
    items = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c["restartCount"] for c in p["status"].get("containerStatuses", [])),
        )
        for p in items
        if terminating or not p["metadata"].get("deletionTimestamp")
    }


def test_moving_the_weights_loses_no_request_and_restarts_no_pod(cluster, gateway, isvc):
    before = _pods(cluster)
    outcomes: list[int | str] = []
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                body = {"model": NAME, "prompt": "Hi", "max_tokens": 2}
                try:
                    outcomes.append(
                        client.post(f"{gateway.url}/{NAME}/v1/completions", json=body).status_code
                    )
                except httpx.HTTPError as exc:
                    outcomes.append(repr(exc))

    sender = threading.Thread(target=send)
    sender.start()
    try:
        time.sleep(3)
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(_isvc(cluster, (50, 50))))

        def weights() -> list[int]:
            """The shared rule's (the last); the API server defaults every other backend's to 1."""
            route = json.loads(
                cluster.kubectl("get", "httproute", NAME, "-n", NAMESPACE, "-o", "json").stdout
            )
            return [b.get("weight") for b in route["spec"]["rules"][-1]["backendRefs"]]

        wait_for(weights, check=lambda w: w == [50, 50], timeout=60, what="the route's new weights")
        time.sleep(5)
    finally:
        stop.set()
        sender.join(150)
    assert outcomes and all(o == 200 for o in outcomes), [o for o in outcomes if o != 200]
    assert _pods(cluster) == before
    print(f"{len(outcomes)} requests while the weights moved, all answered 200")


def test_an_idle_variant_goes_to_zero_and_the_first_request_wakes_it(cluster, gateway, isvc):
    deployment = variant_object_name(NAME, "b")

    def replicas() -> int:
        found = json.loads(
            cluster.kubectl("get", "deployment", deployment, "-n", NAMESPACE, "-o", "json").stdout
        )
        return found["spec"].get("replicas", 1)

    def why() -> str:
        """Each trigger's query answered by the Prometheus KEDA asks, KEDA's view of the object and
        its operator's log: what keeps the variant up."""
        found = json.loads(
            cluster.kubectl("get", "scaledobject", deployment, "-n", NAMESPACE, "-o", "json").stdout
        )
        lines = [f"ScaledObject status: {json.dumps(found.get('status', {}))}"]
        for trigger in found["spec"]["triggers"]:
            meta = trigger["metadata"]
            answer = httpx.get(f"{meta['serverAddress']}/api/v1/query", params={"query": meta["query"]})
            lines.append(f"{trigger['name']}: {meta['query']} -> {answer.text}")
        lines.append(cluster.kubectl("get", "hpa", "-n", NAMESPACE, "-o", "wide").stdout)
        lines.append(cluster.cp.log_tail("keda-operator", 30))
        return "\n".join(lines)

    wait_for(
        replicas,
        check=lambda n: n == 0,
        timeout=STARTUP_SECONDS + 240,
        what="b to scale to zero",
        interval=2,
        details=why,
    )
    # Gone, not only terminating: a draining pod is still an endpoint the gateway may send the
    # request to, which then needs no wake (seen once: answered in a second at zero replicas).
    wait_for(
        lambda: [p for p in _pods(cluster, terminating=True) if p.startswith(deployment)],
        check=lambda pods: not pods,
        timeout=180,
        what="b's pod to go",
        interval=2,
    )
    status = json.loads(cluster.kubectl("get", "infsvc", NAME, "-n", NAMESPACE, "-o", "json").stdout)[
        "status"
    ]
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True"

    # The OpenAI client as users run it: its default two retries, which honour Retry-After.
    client = openai.OpenAI(base_url=f"{gateway.url}/{NAME}/b/v1", api_key="none", timeout=300)
    asked = time.monotonic()
    stream = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, stream=True)
    first_token = None
    text = ""
    for chunk in stream:
        if first_token is None and chunk.choices and chunk.choices[0].text:
            first_token = time.monotonic() - asked
        text += "".join(c.text for c in chunk.choices)
    assert first_token is not None and text
    assert replicas() == 1, why()
    print(f"first request at zero: first token after {first_token:.1f}s")
    if target := os.environ.get("PAGODA_WAKE_RESULT"):
        Path(target).write_text(
            json.dumps(
                {
                    "what": "first request to a variant at zero pods, through the gateway, to first token",
                    "model": "bundled://smollm2-135m on the CPU (manifests/examples/cpu-smollm2.yaml)",
                    "seconds_to_first_token": round(first_token, 1),
                    "keda_polling_interval_seconds": 2,
                    "prometheus_scrape_interval_seconds": 2,
                    "gateway_hold_seconds": 15,
                    "gateway_retry_after_seconds": 30,
                    "command": "PAGODA_WAKE_RESULT=benchmarks/results/cpu/scale_to_zero_wake.json "
                    "pytest tests/e2e/test_gateway.py",
                },
                indent=2,
            )
            + "\n"
        )
