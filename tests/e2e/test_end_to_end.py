"""A user's first minutes, on a cluster that runs real pods (tests/e2e/providers.py).

In order, on one InferenceService made from manifests/examples/cpu-smollm2.yaml: the operator runs
from its image and the example becomes Ready through its probes; the pod is locked down and writes
only to its volumes; the OpenAI client gets a chat completion through the Service's ClusterIP; a
spec change rolls the pod while streams run and loses none, and so does an operator upgrade (a new
runtime image default, the install's, which the example does not pin); queue depth scraped by Prometheus
scales the Deployment up and back down; turning on a draft model rolls the pod to one that
speculates; deleting the InferenceService leaves nothing behind.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import openai
import pytest
import yaml
from conftest import OPERATOR_NAMESPACE
from pagoda_operator.names import LABEL_ISVC, child_selector, variant_object_name
from pagoda_runtime.contract.names import REQUESTS_WAITING as QUEUE_METRIC
from pagoda_runtime.contract.names import SPEC_DECODE_DRAFTS
from polling import wait_for
from providers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = ROOT / "manifests" / "examples" / "cpu-smollm2.yaml"
NAMESPACE = "pagoda-e2e"
NAME = "smollm2"
DEPLOYMENT = variant_object_name(NAME, "cpu")
LABEL = child_selector(NAME)
# A surge pod and the operator fit beside the serving pod on a 2-core machine; as CPU shares,
# as much as a busy host's other processes get.
CPU_REQUEST = "900m"
# Streams on a shared 2-core machine take tens of seconds; the example's 30 s would abort them.
DRAIN_TIMEOUT_SECONDS = 120
STREAMS = 16
# More than maxNumSeqs (16), so that some wait; few enough that the readiness canary, which queues
# behind them, still answers within its deadline on a slow machine.
BURST = 24
ADAPTER_RULES = ROOT / "manifests" / "monitoring" / "prometheus-adapter-rules.yaml"
PSEUDO_FILESYSTEMS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"}
# What the kubelet and runc mount into every container; /dev and the cgroup v1 tmpfs belong to root.
PROVIDED_MOUNTS = {
    "/dev",
    "/sys/fs/cgroup",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/dev/termination-log",
}


def _get(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-n", NAMESPACE, "-o", "json").stdout)


def _runtime_pods(cluster) -> list[dict]:
    return [
        p for p in _get(cluster, "pods", "-l", LABEL)["items"] if not p["metadata"].get("deletionTimestamp")
    ]


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _example(cluster) -> dict:
    """The example as it is (the runtime image is the install's), with a CPU request and a drain
    timeout that fit this machine."""
    isvc = yaml.safe_load(EXAMPLE.read_text())
    assert "image" not in isvc["spec"]["runtime"], "the example must follow the install's runtime image"
    isvc["spec"]["resources"]["cpu"] = CPU_REQUEST
    isvc["spec"]["drain"]["timeoutSeconds"] = DRAIN_TIMEOUT_SECONDS
    return isvc


@pytest.fixture(scope="module")
def isvc(cluster, installed) -> str:
    """The example, applied and Ready; its name."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(_example(cluster)))
    cluster.kubectl(
        "wait", "-n", NAMESPACE, f"infsvc/{NAME}", "--for=condition=Ready", "--timeout=600s", timeout=630
    )
    return NAME


def test_operator_runs_from_its_image_and_the_example_becomes_ready(cluster, isvc):
    operator = json.loads(cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "json").stdout)
    [pod] = operator["items"]
    assert pod["spec"]["containers"][0]["image"] == cluster.operator_image
    assert _ready(pod)

    [runtime] = _runtime_pods(cluster)
    container = runtime["spec"]["containers"][0]
    assert container["image"] == cluster.runtime_image  # the install's default, not the object's
    assert container["startupProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert _ready(runtime)
    table = cluster.kubectl("get", "infsvc", "-n", NAMESPACE).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert dict(zip(header, row, strict=False))["READY"] == "True", table


def test_the_pod_runs_locked_down_and_writes_only_to_its_volumes(cluster, isvc):
    [pod] = _runtime_pods(cluster)
    assert pod["spec"]["automountServiceAccountToken"] is False
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False

    def inside(*command: str) -> subprocess.CompletedProcess:
        return cluster.kubectl(
            "exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "runtime", "--", *command, check=False
        )

    assert inside("id", "-u").stdout.strip() == "10001"
    assert "Read-only file system" in inside("touch", "/home/pagoda/x").stderr
    assert inside("ls", "/var/run/secrets/kubernetes.io").returncode != 0, (
        "a service-account token is mounted"
    )
    assert "NoNewPrivs:\t1" in inside("cat", "/proc/1/status").stdout

    # The root filesystem is read-only, and every writable mount is a volume the pod declares or a
    # mount every container gets: whatever the runtime wrote, it wrote there.
    declared = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    mounts = [line.split() for line in inside("cat", "/proc/self/mounts").stdout.splitlines()]
    [root] = [m for m in mounts if m[1] == "/"]
    assert "ro" in root[3].split(","), root
    unexpected = [
        m[1]
        for m in mounts
        if "rw" in m[3].split(",")
        and m[2] not in PSEUDO_FILESYSTEMS
        and m[1] not in declared | PROVIDED_MOUNTS
        and not m[1].startswith("/proc/")
    ]
    assert not unexpected, f"writable mounts the pod does not declare: {unexpected}"


def test_chat_completion_through_the_cluster_ip_with_the_openai_client(cluster, isvc):
    with cluster.service_url(NAMESPACE, NAME, 8000) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120)
        reply = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16
        )
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0


def _oneshot(url: str, max_tokens: int, record: dict, started: threading.Event | None = None) -> None:
    """One streamed completion on a connection of its own (as a client behind a load balancer opens
    them); record says how it ended. started is set at the first chunk."""
    body = {
        "model": NAME,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    record.update(status=None, done=False, finish=None, error=None)
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=900) as response:
            record["status"] = response.status_code
            for line in response.iter_lines():
                if started is not None:
                    started.set()
                if line == "data: [DONE]":
                    record["done"] = True
                elif line.startswith("data: "):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    record["finish"] = choice.get("finish_reason") or record["finish"]
    except httpx.HTTPError as exc:
        record["error"] = repr(exc)


def _complete(record: dict) -> bool:
    return record["status"] == 200 and record["done"] and record["finish"] == "length"


class Streams:
    """STREAMS clients streaming completions one after another until stop(); every outcome kept."""

    def __init__(self, url: str, count: int = STREAMS, max_tokens: int = 16) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.completed = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._first = [threading.Event() for _ in range(count)]
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(count)]

    def __enter__(self) -> Streams:
        for thread in self._threads:
            thread.start()
        for event in self._first:
            assert event.wait(300), "a stream never started"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(300)

    def _client(self, index: int) -> None:
        while not self._stop.is_set():
            record: dict = {}
            _oneshot(self.url, self.max_tokens, record, self._first[index])
            if _complete(record):
                self.completed += 1
            else:
                self.failures.append(repr(record))


class PodWatch:
    """The last state of a pod before it is deleted, from `kubectl get --watch` (started again if it
    ends before the pod is gone)."""

    def __init__(self, cluster, name: str) -> None:
        self.last: dict = {}
        self._deleted = threading.Event()
        self._command = [
            "kubectl",
            f"--kubeconfig={cluster.kubeconfig}",
            "get",
            "pod",
            name,
            "-n",
            NAMESPACE,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ]
        self._env = getattr(getattr(cluster, "cp", None), "env", None)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._deleted.is_set():
            process = subprocess.Popen(
                self._command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self._env
            )
            decoder, buffer = json.JSONDecoder(), ""
            for line in process.stdout:
                buffer += line
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    continue
                buffer = buffer.lstrip()[end:]
                self.last = event["object"]
                if event["type"] == "DELETED":
                    self._deleted.set()
                    break
            process.terminate()
            if "NotFound" in process.communicate(timeout=10)[1]:
                self._deleted.set()  # gone between two watches: last is what the first one saw
            time.sleep(1)

    @property
    def deleted(self) -> bool:
        return self._deleted.is_set()

    def wait_deleted(self, timeout: float) -> dict:
        assert self._deleted.wait(timeout), f"the old pod still exists after {timeout:g}s"
        return self.last


def test_a_spec_change_rolls_the_pod_without_losing_a_stream(cluster, isvc):
    [old] = _runtime_pods(cluster)
    watch = PodWatch(cluster, old["metadata"]["name"])
    change = {"spec": {"runtime": {"env": [{"name": "PAGODA_E2E_ROLL", "value": "1"}]}}}
    with cluster.service_url(NAMESPACE, NAME, 8000) as url, Streams(url) as streams:
        cluster.kubectl("patch", "infsvc", NAME, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(change))
        cluster.kubectl(
            "rollout", "status", f"deployment/{DEPLOYMENT}", "-n", NAMESPACE, "--timeout=600s", timeout=630
        )
        last = watch.wait_deleted(300)
        time.sleep(5)  # and the new pod serves them too
    assert not streams.failures, f"{len(streams.failures)} streams lost: {streams.failures[:5]}"
    assert streams.completed >= STREAMS
    [new] = _runtime_pods(cluster)
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert {"name": "PAGODA_E2E_ROLL", "value": "1"} in new["spec"]["containers"][0]["env"]
    [status] = last["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 0, terminated
    assert terminated["message"].startswith("drained in "), terminated
    assert "0 aborted" in terminated["message"], terminated


def _template_image(cluster) -> str:
    return _get(cluster, "deployment", DEPLOYMENT)["spec"]["template"]["spec"]["containers"][0]["image"]


def test_an_operator_upgrade_rolls_the_pod_without_losing_a_stream(cluster, isvc):
    """The operator's runtime image changes (as `images:` or the chart's runtime.image would change
    it); the operator restarts with it and rolls the service within its rollout rules."""
    [old] = _runtime_pods(cluster)
    watch = PodWatch(cluster, old["metadata"]["name"])
    upgraded = cluster.runtime_image_alias("operator-upgrade")
    with cluster.service_url(NAMESPACE, NAME, 8000) as url, Streams(url) as streams:
        cluster.kubectl(
            "set",
            "env",
            "deployment/pagoda-operator",
            "-n",
            OPERATOR_NAMESPACE,
            f"PAGODA_RUNTIME_IMAGE={upgraded}",
        )
        wait_for(
            lambda: _template_image(cluster) == upgraded, timeout=300, what="the operator to roll the service"
        )
        cluster.kubectl(
            "rollout", "status", f"deployment/{DEPLOYMENT}", "-n", NAMESPACE, "--timeout=600s", timeout=630
        )
        last = watch.wait_deleted(300)
        time.sleep(5)  # and the new pod serves them too
    assert not streams.failures, f"{len(streams.failures)} streams lost: {streams.failures[:5]}"
    assert streams.completed >= STREAMS
    [new] = _runtime_pods(cluster)
    assert new["spec"]["containers"][0]["image"] == upgraded
    assert "image" not in _get(cluster, "infsvc", NAME)["spec"]["runtime"]
    terminated = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and "0 aborted" in terminated["message"], terminated
    events = _get(cluster, "events", "--field-selector", f"involvedObject.name={NAME}")["items"]
    assert any(e["reason"] == "OperatorUpgrade" for e in events), [e["reason"] for e in events]


def _autoscaling(scale_down_seconds: int) -> str:
    window = {"targetQueueDepth": 2, "scaleDownStabilizationSeconds": scale_down_seconds}
    return json.dumps({"spec": {"autoscaling": window}})


def test_queue_depth_scales_up_then_down_without_losing_a_request(cluster, isvc):
    if cluster.custom_metrics_missing:
        pytest.skip(cluster.custom_metrics_missing)
    rules = yaml.safe_load(ADAPTER_RULES.read_text())["data"]["config.yaml"]
    # While the load runs, two pods can empty the queue and a short scale-down window would take
    # one back mid-burst; the window is made short only once the load has stopped.
    cluster.kubectl("patch", "infsvc", NAME, "-n", NAMESPACE, "--type=merge", "-p", _autoscaling(600))
    [first] = _runtime_pods(cluster)
    with cluster.custom_metrics(rules), cluster.service_url(NAMESPACE, NAME, 8000) as url:
        # The pipeline (discovery, scrape, adapter) serves the pod's queue depth before the load
        # starts; a queue that empties before anyone measured it scales nothing.
        path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/*/{QUEUE_METRIC}"
        wait_for(
            lambda: cluster.kubectl("get", "--raw", path, check=False).stdout,
            check=lambda out: first["metadata"]["name"] in out,
            timeout=180,
            what="the custom metrics API to serve the pod's queue depth",
            interval=2,
        )
        # Far more than the pod runs at once (maxNumSeqs), kept up until the second pod has served:
        # the rest wait and the queue asks for a pod.
        with Streams(url, count=BURST, max_tokens=64) as load:
            wait_for(
                lambda: _get(cluster, "deployment", DEPLOYMENT)["spec"]["replicas"],
                check=lambda n: n == 2,
                timeout=300,
                what="the autoscaler to ask for a second pod",
                interval=2,
            )
            pods = wait_for(
                lambda: _runtime_pods(cluster),
                check=lambda ps: len(ps) == 2 and all(map(_ready, ps)),
                timeout=600,
                what="the second pod to become Ready",
                interval=2,
            )
            [second] = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
            # Watched from now: once the load stops, the scale-down follows within seconds.
            watches = [PodWatch(cluster, p["metadata"]["name"]) for p in pods]
            served = {}
            if cluster.name == "local":  # only there are pod IPs routed from the host
                _oneshot(f"http://{second['status']['podIP']}:8000", 8, served)
        assert not load.failures, f"{len(load.failures)} requests lost: {load.failures[:3]}"
        assert load.completed >= BURST, load.completed
        if served:
            assert _complete(served), served

        # The queue is empty again: back to one pod, which drains what it was serving.
        cluster.kubectl("patch", "infsvc", NAME, "-n", NAMESPACE, "--type=merge", "-p", _autoscaling(5))
        with Streams(url, count=4) as streams:
            wait_for(
                lambda: _get(cluster, "deployment", DEPLOYMENT)["spec"]["replicas"],
                check=lambda n: n == 1,
                timeout=300,
                what="the autoscaler to scale back to one pod",
                interval=2,
            )
            removed = wait_for(
                lambda: [w for w in watches if w.deleted], timeout=300, what="a pod to be removed", interval=1
            )[0]
        assert not streams.failures, f"{len(streams.failures)} streams lost: {streams.failures[:5]}"
    [status] = removed.last["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["message"].startswith("drained in "), terminated
    assert "0 aborted" in terminated["message"], terminated


# Run in the runtime's container: one greedy completion and the metrics after it, from the pod itself
# (the Service may still route to the pod being drained).
_IN_POD = """
import json, sys, urllib.request
body = {"model": sys.argv[1], "prompt": sys.argv[2], "max_tokens": 24, "temperature": 0, "ignore_eos": True}
request = urllib.request.Request("http://127.0.0.1:8000/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(request, timeout=300))["choices"][0]["text"]
metrics = urllib.request.urlopen("http://127.0.0.1:8000/metrics", timeout=30).read().decode()
print(json.dumps({"text": text, "metrics": metrics}))
"""


def _greedy_text_in(cluster, pod: dict, prompt: str) -> dict:
    out = cluster.kubectl(
        "exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "runtime", "--",
        "python", "-c", _IN_POD, NAME, prompt, timeout=330,
    )  # fmt: skip
    return json.loads(out.stdout)


def _speculates(pod: dict) -> bool:
    return "--speculative-config" in pod["spec"]["containers"][0].get("args", [])


def test_a_draft_model_turned_on_rolls_the_pod_and_the_new_one_speculates(cluster, isvc):
    """A variant's speculative field (the bundled model drafting for itself): the operator renders
    --speculative-config with the draft where the pod reads it, the new pod becomes Ready, drafts
    (its vLLM spec-decode counters grow) and answers a greedy request with the text the pod
    without speculation gave."""
    prompt = "Repeat after me: one two three four, one two three four, one two three"
    [old] = wait_for(
        lambda: _runtime_pods(cluster), check=lambda ps: len(ps) == 1, timeout=300, what="one pod", interval=2
    )
    before = _greedy_text_in(cluster, old, prompt)
    [variant] = _get(cluster, "infsvc", NAME)["spec"]["variants"]
    draft = {"source": "bundled://smollm2-135m", "family": "smollm2-135m"}
    variant["speculative"] = {"method": "draft_model", "numSpeculativeTokens": 3, "model": draft}
    patch = json.dumps({"spec": {"variants": [variant]}})
    cluster.kubectl("patch", "infsvc", NAME, "-n", NAMESPACE, "--type=merge", "-p", patch)
    [new] = wait_for(
        lambda: [p for p in _runtime_pods(cluster) if _speculates(p) and _ready(p)],
        timeout=600,
        what="a Ready pod with the speculative config",
        interval=2,
    )
    after = _greedy_text_in(cluster, new, prompt)
    assert after["text"] == before["text"]
    drafts = [m for m in after["metrics"].splitlines() if m.startswith(SPEC_DECODE_DRAFTS + "_total")]
    assert drafts and float(drafts[0].rsplit(" ", 1)[1]) > 0, drafts


def test_deleting_the_inference_service_removes_every_child(cluster, isvc):
    uid = _get(cluster, "infsvc", NAME)["metadata"]["uid"]
    cluster.kubectl("delete", "infsvc", NAME, "-n", NAMESPACE, "--timeout=300s", timeout=330)
    kinds = (
        "deployments,replicasets,pods,services,endpointslices,poddisruptionbudgets,horizontalpodautoscalers"
    )

    def owned() -> list[str]:
        items = _get(cluster, kinds)["items"]
        return [
            f"{i['kind']}/{i['metadata']['name']}"
            for i in items
            if LABEL_ISVC in i["metadata"].get("labels", {})
            or any(o["uid"] == uid for o in i["metadata"].get("ownerReferences", []))
        ]

    wait_for(
        owned,
        check=lambda left: not left,
        timeout=300,
        what="every child of the InferenceService to be gone",
        interval=2,
    )
