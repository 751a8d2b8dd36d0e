"""The clusters the end-to-end suite runs on, behind one interface.

``local`` (the default): the loopback control plane (e2e/controlplane) with a real worker node
(e2e/node: kubelet, containerd, runc, CNI, kube-proxy) in its own network namespace, and the two
images built by images/build.sh. Service ClusterIPs and pod IPs are routed from the host.

``kind``: a kind cluster on a Docker engine, images built with ``docker build`` on the public bases
and loaded with ``kind load``. Its ClusterIPs are not reachable from the host, so a Service is
reached through ``kubectl port-forward``.

Pick one with PAGODA_E2E_PROVIDER=local|kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from repo_modules import ROOT, controlplane, node

ENSURE_PROMETHEUS = ROOT / "e2e" / "controlplane" / "ensure-prometheus.sh"


class Cluster:
    """What the suite needs of a cluster: kubectl, the images' names, and a way to a Service."""

    name: str
    operator_image: str
    runtime_image: str
    kubeconfig: str
    # Why custom_metrics() cannot work here, or None when it can.
    custom_metrics_missing: str | None = None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    @contextlib.contextmanager
    def service_url(self, namespace: str, service: str, port: int) -> Iterator[str]:
        raise NotImplementedError

    def runtime_image_alias(self, tag: str) -> str:
        """A second reference, on the nodes, to the runtime image: what an operator upgrade to a
        new runtime image looks like to the pods, without building another image."""
        raise NotImplementedError

    @contextlib.contextmanager
    def custom_metrics(self, adapter_rules: str) -> Iterator[None]:
        """Prometheus scraping the pods and prometheus-adapter serving custom.metrics.k8s.io."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


def _built_images() -> dict[str, tuple[str, Path]]:
    """images/build.sh's output (a no-op when nothing changed): NAME -> (reference, OCI archive)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh")], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"images/build.sh failed:\n{proc.stderr[-4000:]}")
    out = {}
    for line in proc.stdout.splitlines():
        name, ref, archive = line.split()
        out[name] = (ref, Path(archive))
    return out


class LocalCluster(Cluster):
    name = "local"

    @staticmethod
    def unavailable_reason() -> str | None:
        return node.unavailable_reason()

    def __init__(self) -> None:
        images = _built_images()
        self.cp = controlplane.ControlPlane()
        self.cp.start()
        try:
            self.node = node.Node(self.cp)
            self.node.start()
            for ref, archive in images.values():
                self.node.import_image(ref, archive)
        except BaseException:
            self.cp.stop(force_keep=True)
            raise
        self.kubeconfig = self.cp.kubeconfig
        self.operator_image = images["pagoda-operator"][0]
        self.runtime_image = images["pagoda-runtime"][0]
        self.kubectl_binary = str(self.cp.bin["kubectl"])

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess:
        proc = self.cp.kubectl(*args, input=input, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    @contextlib.contextmanager
    def service_url(self, namespace: str, service: str, port: int) -> Iterator[str]:
        ip = self.kubectl(
            "get", "service", service, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
        ).stdout.strip()
        yield f"http://{ip}:{port}"

    def runtime_image_alias(self, tag: str) -> str:
        alias = f"{self.runtime_image.rpartition(':')[0]}:{tag}"
        self.node.ctr("images", "tag", "--force", self.runtime_image, alias)
        return alias

    @contextlib.contextmanager
    def custom_metrics(self, adapter_rules: str) -> Iterator[None]:
        with self.prometheus() as url:
            try:
                self.cp.start_prometheus_adapter(url, adapter_rules)
                yield
            finally:
                with contextlib.suppress(Exception):
                    self.cp.stop_prometheus_adapter()

    @contextlib.contextmanager
    def prometheus(self, static: dict[str, str] | None = None) -> Iterator[str]:
        """A Prometheus on this host scraping the annotated pods and `static` (job -> host:port);
        yields its URL."""
        found = subprocess.run(["bash", str(ENSURE_PROMETHEUS)], capture_output=True, text=True, timeout=600)
        if found.returncode != 0:
            raise RuntimeError(f"no prometheus binary: {found.stderr.strip()}")
        work = Path(tempfile.mkdtemp(prefix="pagoda-prometheus-"))
        targets = work / "pods.json"
        targets.write_text("[]")
        (work / "prometheus.yml").write_text(json.dumps(_prometheus_config(targets, static or {})))
        port = controlplane._free_port()
        with open(work / "prometheus.log", "wb") as log:
            prometheus = subprocess.Popen(
                [
                    found.stdout.split()[-1],
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        stop = threading.Event()
        discovery = threading.Thread(target=self._discover_pods, args=(targets, stop), daemon=True)
        discovery.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()
            discovery.join(30)
            prometheus.terminate()
            prometheus.wait(30)
            shutil.rmtree(work, ignore_errors=True)

    def _discover_pods(self, targets: Path, stop: threading.Event) -> None:
        """Kubernetes pod discovery as Prometheus' kubernetes_sd does it (Debian builds Prometheus
        without it): every running pod with prometheus.io annotations, at its IP, labelled with its
        namespace and name, written for file_sd."""
        while not stop.wait(1.0):
            listed = self.cp.kubectl("get", "pods", "-A", "-o", "json", check=False)
            if listed.returncode != 0:
                continue
            groups = []
            for pod in json.loads(listed.stdout)["items"]:
                notes = pod["metadata"].get("annotations", {})
                ip = pod["status"].get("podIP")
                if (
                    notes.get("prometheus.io/scrape") != "true"
                    or not ip
                    or pod["status"]["phase"] != "Running"
                ):
                    continue
                groups.append(
                    {
                        "targets": [f"{ip}:{notes.get('prometheus.io/port', '80')}"],
                        "labels": {
                            "__metrics_path__": notes.get("prometheus.io/path", "/metrics"),
                            "namespace": pod["metadata"]["namespace"],
                            "pod": pod["metadata"]["name"],
                        },
                    }
                )
            staging = targets.with_suffix(".tmp")
            staging.write_text(json.dumps(groups))
            staging.replace(targets)

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            self.cp.stop()


def _prometheus_config(targets: Path, static: dict[str, str]) -> dict:
    """static: more scrape jobs, job name -> host:port of a target on this machine."""
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
        "scrape_configs": [
            {
                "job_name": "annotated-pods",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "2s"}],
            },
            *({"job_name": job, "static_configs": [{"targets": [target]}]} for job, target in static.items()),
        ],
    }


class KindCluster(Cluster):
    name = "kind"
    custom_metrics_missing = "the kind provider installs no Prometheus or prometheus-adapter"
    cluster_name = os.environ.get("PAGODA_KIND_CLUSTER", "pagoda-e2e")

    @staticmethod
    def unavailable_reason() -> str | None:
        for tool in ("docker", "kind", "kubectl"):
            if shutil.which(tool) is None:
                return f"the kind provider needs {tool} on PATH"
        if subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode != 0:
            return "the kind provider needs a running Docker engine; none answers"
        return None

    def __init__(self) -> None:
        tag = "e2e"
        self.operator_image = f"pagoda-operator:{tag}"
        self.runtime_image = f"pagoda-runtime:{tag}"
        for name, ref in (("operator", self.operator_image), ("runtime", self.runtime_image)):
            subprocess.run(
                ["docker", "build", "-q", "-f", f"images/{name}.Dockerfile", "-t", ref, "."],
                cwd=ROOT,
                check=True,
                timeout=3600,
            )
        clusters = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True).stdout.split()
        if self.cluster_name not in clusters:
            subprocess.run(
                ["kind", "create", "cluster", "--name", self.cluster_name, "--wait", "180s"],
                check=True,
                timeout=600,
            )
        self._dir = tempfile.mkdtemp(prefix="pagoda-kind-")
        self.kubeconfig = os.path.join(self._dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            subprocess.run(["kind", "get", "kubeconfig", "--name", self.cluster_name], stdout=f, check=True)
        subprocess.run(
            [
                "kind",
                "load",
                "docker-image",
                "--name",
                self.cluster_name,
                self.operator_image,
                self.runtime_image,
            ],
            check=True,
            timeout=1200,
        )

    @contextlib.contextmanager
    def service_url(self, namespace: str, service: str, port: int) -> Iterator[str]:
        forward = subprocess.Popen(
            [
                "kubectl",
                f"--kubeconfig={self.kubeconfig}",
                "-n",
                namespace,
                "port-forward",
                f"service/{service}",
                f":{port}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = forward.stdout.readline()
            local = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert local, f"kubectl port-forward said {line!r}"
            yield f"http://127.0.0.1:{local.group(1)}"
        finally:
            forward.terminate()
            forward.wait(10)

    def runtime_image_alias(self, tag: str) -> str:
        alias = f"{self.runtime_image.rpartition(':')[0]}:{tag}"
        subprocess.run(["docker", "tag", self.runtime_image, alias], check=True)
        subprocess.run(
            ["kind", "load", "docker-image", "--name", self.cluster_name, alias], check=True, timeout=1200
        )
        return alias

    def stop(self) -> None:
        if os.environ.get("PAGODA_KIND_KEEP") != "1":
            subprocess.run(["kind", "delete", "cluster", "--name", self.cluster_name], check=False)
        shutil.rmtree(self._dir, ignore_errors=True)


PROVIDERS = {"local": LocalCluster, "kind": KindCluster}


def selected() -> type[Cluster]:
    name = os.environ.get("PAGODA_E2E_PROVIDER", "local")
    if name not in PROVIDERS:
        raise ValueError(f"PAGODA_E2E_PROVIDER={name!r} is not one of {sorted(PROVIDERS)}")
    return PROVIDERS[name]
