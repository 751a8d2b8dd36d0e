"""A real Kubernetes control plane on loopback for integration tests.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local processes (no
containers, no kubelet); kwok fakes a GPU node so pods get scheduled and become Ready without
running anything. Binaries come from ``build.sh`` (pinned in ``versions.env``, cached outside the
repository); a missing binary triggers ``build.sh core`` on first use.

Stdlib only. Usage::

    from controlplane import ControlPlane

    with ControlPlane() as cp:
        cp.kubectl("get", "nodes", "-o", "wide")
        subprocess.run([...], env=cp.env)   # KUBECONFIG and kubectl on PATH

``stop()`` kills every process group it started and removes the temporary directory (kept, with
the component logs, when ``keep_dir=True`` or ``PAGODA_CP_KEEP=1``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
VERSIONS_ENV = HERE / "versions.env"

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_FIRST_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"

_CORE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)


class ControlPlaneError(RuntimeError):
    """The control plane failed to start, or a component died."""


def read_versions(path: Path = VERSIONS_ENV) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def tools_cache() -> Path:
    env = os.environ.get("PAGODA_TOOLS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pagoda-tools"


def binary_path(name: str) -> Path:
    v = read_versions()
    version = {
        "etcd": v["ETCD_VERSION"],
        "kwok": v["KWOK_VERSION"],
        "prometheus-adapter": v["PROMETHEUS_ADAPTER_VERSION"],
        "minio": v["MINIO_VERSION"],
        "lws-controller": v["LWS_VERSION"],
        "helm": v["HELM_VERSION"],
        "kstatus-check": v["KSTATUS_VERSION"],
        "traefik": v["TRAEFIK_VERSION"],
        "keda-operator": v["KEDA_VERSION"],
        "keda-adapter": v["KEDA_VERSION"],
    }.get(name, v["KUBERNETES_VERSION"])
    return tools_cache() / f"{name}-{version}" / name


def kwok_stages_path() -> Path:
    return binary_path("kwok").parent / "stages.yaml"


def ensure_binaries(names: tuple[str, ...] = _CORE_BINARIES) -> dict[str, Path]:
    """Return name -> path, running build.sh for whatever is missing (slow the first time)."""
    paths = {n: binary_path(n) for n in names}
    missing = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
    if "kwok" in names and not kwok_stages_path().is_file() and "kwok" not in missing:
        missing.append("kwok")  # stages.yaml is written together with the kwok binary
    if missing:
        print(
            f"controlplane: building {' '.join(missing)} with {BUILD_SH.name} (one-off, several minutes)...",
            file=sys.__stderr__,
            flush=True,
        )
        # A stale half-installed kwok (binary without stages) must be rebuilt.
        if "kwok" in missing and paths.get("kwok") and paths["kwok"].exists():
            paths["kwok"].unlink()
        proc = subprocess.run(
            ["bash", str(BUILD_SH), *missing],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"build.sh failed ({proc.returncode}):\n{_tail(proc.stdout)}")
        still = [n for n, p in paths.items() if not os.access(p, os.X_OK)]
        if still:
            raise ControlPlaneError(f"build.sh did not produce {still}:\n{_tail(proc.stdout)}")
    return paths


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """Linux: SIGKILL the component if the process that started it dies (even by SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; stop()/atexit still clean up
        pass


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


@dataclass(frozen=True)
class Gateway:
    """A Gateway served by start_traefik: where clients and Prometheus reach it."""

    name: str
    namespace: str
    url: str  # the listener, http://127.0.0.1:PORT
    metrics_url: str  # Traefik's Prometheus metrics


@dataclass
class _Component:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    logf: Any = field(default=None, repr=False)


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on 127.0.0.1."""

    def __init__(
        self,
        *,
        node_name: str = "gpu-node-0",
        gpus: int = 8,
        workdir: str | os.PathLike | None = None,
        keep_dir: bool | None = None,
        aggregator_routing: bool = False,
        hpa_sync_period: str = "5s",
        start_timeout: float = 120.0,
    ) -> None:
        self.node_name = node_name
        self.gpus = gpus
        self.aggregator_routing = aggregator_routing
        self.hpa_sync_period = hpa_sync_period
        self.start_timeout = start_timeout
        self.keep_dir = keep_dir if keep_dir is not None else os.environ.get("PAGODA_CP_KEEP") == "1"
        self._own_dir = workdir is None
        self.dir = Path(workdir) if workdir else None
        self._components: list[_Component] = []
        self._started = False
        self.server = ""
        self.bin: dict[str, Path] = {}

    # ----------------------------------------------------------------- paths for callers
    @property
    def kubeconfig(self) -> str:
        return str(self._p("kubeconfig"))

    @property
    def ca_file(self) -> str:
        return str(self._p("pki", "ca.crt"))

    @property
    def front_proxy_ca_file(self) -> str:
        return str(self._p("pki", "front-proxy-ca.crt"))

    @property
    def admin_cert_file(self) -> str:
        return str(self._p("pki", "admin.crt"))

    @property
    def admin_key_file(self) -> str:
        return str(self._p("pki", "admin.key"))

    @property
    def logs_dir(self) -> Path:
        return self._p("logs")

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG and the pinned kubectl first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        kubectl_dir = str(self.bin.get("kubectl", binary_path("kubectl")).parent)
        env["PATH"] = kubectl_dir + os.pathsep + env.get("PATH", "")
        return env

    def _p(self, *parts: str) -> Path:
        if self.dir is None:
            raise ControlPlaneError("control plane not started")
        return self.dir.joinpath(*parts)

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._started:
            return self
        self.bin = ensure_binaries()
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl is required on PATH")
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="pagoda-cp-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop(force_keep=True)  # keep the logs the error message points at
            raise
        return self

    def _start(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        ports = {k: _free_port() for k in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok")}
        self.server = f"https://127.0.0.1:{ports['apiserver']}"
        self._make_pki()
        self._write_kubeconfig()
        d = self.dir
        assert d is not None

        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        self._spawn(
            "etcd",
            [
                str(self.bin["etcd"]),
                "--name=default",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: self._http_ok(f"{etcd_url}/health"), deadline)

        pki = d / "pki"
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={d / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                # aggregation layer (APIService, e.g. custom.metrics.k8s.io from an adapter)
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                f"--enable-aggregator-routing={'true' if self.aggregator_routing else 'false'}",
                # the "kubernetes" Service would point at 127.0.0.1, which Endpoints reject
                "--endpoint-reconciler-type=none",
                # a real node (e2e/node) is reached by its IP for logs and exec: no DNS knows it
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self._api_ok("/readyz"), deadline)

        kc = self.kubeconfig
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin["kube-controller-manager"]),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kcm']}",
                f"--cert-dir={d / 'kcm-certs'}",
                "--leader-elect=false",
                "--controllers=*,bootstrapsigner,tokencleaner",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--flex-volume-plugin-dir={d / 'flexvolume'}",  # default is under /usr/libexec
                f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period}",
                "--horizontal-pod-autoscaler-downscale-stabilization=15s",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin["kube-scheduler"]),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={d / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                str(self.bin["kwok"]),
                f"--config={kwok_stages_path()}",
                f"--kubeconfig={kc}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                f"--cidr={POD_CIDR.replace('0.0/16', '0.1/16')}",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )
        for name, port in (("kube-controller-manager", ports["kcm"]), ("kube-scheduler", ports["scheduler"])):
            url = f"https://127.0.0.1:{port}/healthz"
            self._wait(name, lambda u=url: self._http_ok(u, insecure=True), deadline)

        self.create_gpu_node(self.node_name, gpus=self.gpus)
        self._wait("kwok", lambda: self.node_ready(self.node_name), deadline)
        # pods can only be admitted once the serviceaccount controller made "default"
        self._wait(
            "kube-controller-manager",
            lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
            deadline,
        )
        self.start_seconds = time.monotonic() - t0

    def stop(self, force_keep: bool = False) -> None:
        """Terminate every started process group (SIGTERM, then SIGKILL) and clean up."""
        for c in reversed(self._components):
            self._terminate(c)
        self._components.clear()
        if self._started:
            atexit.unregister(self.stop)
        self._started = False
        keep = force_keep or self.keep_dir or not self._own_dir
        if self.dir is not None and self._own_dir and not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    @staticmethod
    def _terminate(c: _Component, grace: float = 10.0) -> None:
        p = c.proc
        if p is not None:
            pgid = p.pid  # start_new_session=True: each component leads its own group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=grace)
            # then whatever is left of the group (children), even if the leader exited
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=grace)
        if c.logf is not None:
            c.logf.close()
            c.logf = None

    # ----------------------------------------------------------------- PKI + kubeconfig
    def _make_pki(self) -> None:
        """CA, apiserver serving cert, admin client cert, front-proxy CA + client, SA keys."""
        pki = self._p("pki")
        pki.mkdir(exist_ok=True)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")

        def ca(name: str, cn: str) -> None:
            _openssl(
                "req",
                "-x509",
                *ec,
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.crt",
                "-days",
                "3650",
                "-subj",
                f"/CN={cn}",
                cwd=pki,
            )

        def leaf(name: str, ca_name: str, subj: str, ext: str) -> None:
            (pki / f"{name}.ext").write_text(ext)
            _openssl(
                "req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=pki
            )
            _openssl(
                "x509",
                "-req",
                "-in",
                f"{name}.csr",
                "-CA",
                f"{ca_name}.crt",
                "-CAkey",
                f"{ca_name}.key",
                "-CAcreateserial",
                "-days",
                "3650",
                "-extfile",
                f"{name}.ext",
                "-out",
                f"{name}.crt",
                cwd=pki,
            )

        client = "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
        ca("ca", "pagoda-test-ca")
        ca("front-proxy-ca", "pagoda-test-front-proxy-ca")
        sans = ",".join(
            [
                "IP:127.0.0.1",
                f"IP:{SERVICE_FIRST_IP}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        leaf(
            "apiserver",
            "ca",
            "/CN=kube-apiserver",
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        )
        leaf("admin", "ca", "/O=system:masters/CN=pagoda-admin", client)
        leaf("front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client", client)
        _openssl(
            "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki
        )
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

    def _write_kubeconfig(self) -> None:
        pki = self._p("pki")
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "pagoda-test",
                    "cluster": {"server": self.server, "certificate-authority": str(pki / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "pagoda-admin",
                    "user": {
                        "client-certificate": str(pki / "admin.crt"),
                        "client-key": str(pki / "admin.key"),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "pagoda-test",
                    "context": {"cluster": "pagoda-test", "user": "pagoda-admin", "namespace": "default"},
                }
            ],
            "current-context": "pagoda-test",
        }
        path = self._p("kubeconfig")
        path.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is valid YAML
        path.chmod(0o600)

    # ----------------------------------------------------------------- processes
    def _spawn(
        self, name: str, argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> _Component:
        log = self.logs_dir / f"{name}.log"
        logf = open(log, "ab")  # noqa: SIM115 - closed in _terminate
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd or self.dir,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        c = _Component(name=name, argv=argv, log=log, proc=proc, logf=logf)
        self._components.append(c)
        return c

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            return _tail((self.logs_dir / f"{name}.log").read_text(errors="replace"), lines)
        except OSError:
            return "(no log)"

    def _check_alive(self) -> None:
        for c in self._components:
            if c.proc is not None and c.proc.poll() is not None:
                raise ControlPlaneError(
                    f"{c.name} exited with {c.proc.returncode}; log {c.log}:\n" + self.log_tail(c.name)
                )

    def _wait(self, name: str, ok, deadline: float, interval: float = 0.2) -> None:
        while True:
            self._check_alive()
            try:
                if ok():
                    return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out waiting for {name}; log {self.logs_dir / (name + '.log')}:\n"
                    + self.log_tail(name)
                )
            time.sleep(interval)

    # ----------------------------------------------------------------- HTTP
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(self.admin_cert_file, self.admin_key_file)
        return ctx

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the apiserver as cluster admin; returns parsed JSON (or text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, context=self._ssl_context(), timeout=timeout) as r:
            raw = r.read().decode()
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    def _api_ok(self, path: str) -> bool:
        try:
            self.api("GET", path, timeout=5)
            return True
        except urllib.error.HTTPError:
            return False
        except (urllib.error.URLError, ssl.SSLError, ConnectionError, TimeoutError):
            return False

    @staticmethod
    def _http_ok(url: str, insecure: bool = False) -> bool:
        ctx = None
        if insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ssl.SSLError, ConnectionError, TimeoutError):
            return False

    # ----------------------------------------------------------------- cluster helpers
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess:
        """Run the pinned kubectl against this cluster; raises on failure when check=True."""
        proc = subprocess.run(
            [str(self.bin["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def create_gpu_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        product: str = GPU_PRODUCT,
        cpu: str = "64",
        memory: str = "512Gi",
        pods: str = "110",
        taint: bool = True,
        labels: dict[str, str] | None = None,
    ) -> dict:
        """Create a kwok-managed fake node advertising ``nvidia.com/gpu``."""
        resources = {"cpu": cpu, "memory": memory, "pods": pods, "nvidia.com/gpu": str(gpus)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    "nvidia.com/gpu.product": product,
                    "nvidia.com/gpu.count": str(gpus),
                    **(labels or {}),
                },
            },
            "spec": {
                "taints": (
                    [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if taint else []
                ),
            },
            "status": {"capacity": resources, "allocatable": dict(resources)},
        }
        return self.api("POST", "/api/v1/nodes", node)

    def start_prometheus_adapter(
        self,
        prometheus_url: str,
        rules_yaml: str,
        *,
        relist_interval: str = "5s",
        timeout: float = 60.0,
    ) -> int:
        """Run prometheus-adapter on loopback and register it as custom.metrics.k8s.io/v1beta1.

        The APIService points at an ExternalName Service (``localhost``): with
        ``aggregator_routing=False`` (the default) the aggregator dials the external name, while
        endpoint routing would need a non-loopback endpoint IP. ``rules_yaml`` is the adapter's
        ``--config`` (give at least one rule: with none the adapter serves no custom metrics API).
        The adapter is stopped by ``stop()`` or ``stop_prometheus_adapter()``. Returns its port.
        """
        adapter = ensure_binaries(("prometheus-adapter",))["prometheus-adapter"]
        port = _free_port()
        cfg = self._p("prometheus-adapter.yaml")
        cfg.write_text(rules_yaml)
        kc = self.kubeconfig
        self._spawn(
            "prometheus-adapter",
            [
                str(adapter),
                f"--lister-kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--prometheus-url={prometheus_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._p('prometheus-adapter-certs')}",
                f"--config={cfg}",
                f"--metrics-relist-interval={relist_interval}",
            ],
        )
        objs = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "prometheus-adapter", "namespace": "kube-system"},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "https", "port": port}],
                },
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": "v1beta1.custom.metrics.k8s.io"},
                "spec": {
                    "group": "custom.metrics.k8s.io",
                    "version": "v1beta1",
                    "service": {"name": "prometheus-adapter", "namespace": "kube-system", "port": port},
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        )
        self._wait(
            "prometheus-adapter",
            lambda: self._api_ok("/apis/custom.metrics.k8s.io/v1beta1"),
            time.monotonic() + timeout,
            interval=0.5,
        )
        return port

    def stop_prometheus_adapter(self) -> None:
        """Unregister custom.metrics.k8s.io/v1beta1 and stop every adapter started here.

        An APIService whose backend is gone breaks discovery for every later client (kubectl,
        kopf, the namespace controller, which then cannot finish deleting a namespace), so a
        caller done with custom metrics removes the registration rather than leaving it dangling.
        """
        self.kubectl("delete", "apiservice", "v1beta1.custom.metrics.k8s.io", "--ignore-not-found")
        self.kubectl("delete", "service", "prometheus-adapter", "-n", "kube-system", "--ignore-not-found")
        for c in [c for c in self._components if c.name == "prometheus-adapter"]:
            self._terminate(c)
            self._components.remove(c)

    def start_lws_controller(self, *, timeout: float = 60.0) -> None:
        """Install LeaderWorkerSet (its CRDs from the pinned module) and run its controller on loopback.

        Its admission webhooks are what label each pod with its worker index and inject
        LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX, so they are registered, not disabled:
        by URL on 127.0.0.1 with a serving certificate of this control plane's CA, in place of the
        in-cluster Service and the certificate rotation a real install runs (the one part of LWS not
        exercised here). The pod webhooks see only LeaderWorkerSet pods (an objectSelector), so
        other tests' pods never depend on this controller.
        """
        binary = ensure_binaries(("lws-controller",))["lws-controller"]
        self.kubectl("apply", "--server-side", "-f", str(binary.parent / "leaderworkersets.yaml"))
        deadline = time.monotonic() + timeout

        def established() -> bool:
            crd = self.api(
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                "leaderworkersets.leaderworkerset.x-k8s.io",
            )
            return any(
                c["type"] == "Established" and c["status"] == "True"
                for c in crd.get("status", {}).get("conditions") or []
            )

        self._wait("leaderworkersets CRD", established, deadline, interval=0.5)
        certs = self._p("lws-certs")
        certs.mkdir(exist_ok=True)
        pki = self._p("pki")
        (certs / "tls.ext").write_text(
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
        )
        _openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
            "-subj",
            "/CN=lws-webhook",
            cwd=certs,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            "tls.ext",
            "-out",
            "tls.crt",
            cwd=certs,
        )
        port, health = _free_port(), _free_port()
        config = self._p("lws-config.yaml")
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "config.lws.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(certs)},
                    "metrics": {"bindAddress": "0"},
                    "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
                }
            )
        )
        self._spawn("lws-controller", [str(binary), f"--config={config}", f"--kubeconfig={self.kubeconfig}"])
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        lws_pods = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}

        def hook(name: str, path: str, group: str, resource: str, operations: list[str]) -> dict:
            out = {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
                "rules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "operations": operations,
                        "resources": [resource],
                    }
                ],
            }
            if resource == "pods":
                out["objectSelector"] = lws_pods
            return out

        lws = ("leaderworkerset.x-k8s.io", "leaderworkersets")
        configurations = [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "lws-mutating"},
                "webhooks": [
                    hook(
                        "mleaderworkerset.kb.io",
                        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                        *lws,
                        ["CREATE", "UPDATE"],
                    ),
                    hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", ["CREATE"]),
                ],
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "lws-validating"},
                "webhooks": [
                    hook(
                        "vleaderworkerset.kb.io",
                        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                        *lws,
                        ["CREATE", "UPDATE"],
                    ),
                    hook("vpod.kb.io", "/validate--v1-pod", "", "pods", ["CREATE", "UPDATE"]),
                ],
            },
        ]
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": configurations}),
        )
        self._wait(
            "lws-controller",
            lambda: self._http_ok(f"http://127.0.0.1:{health}/readyz"),
            deadline,
            interval=0.5,
        )
        # The webhook server starts once the controllers are set up, after readyz answers.
        self._wait(
            "lws-controller",
            lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None,
            deadline,
            interval=0.5,
        )

    def _install_crds(self, manifest: Path, names: list[str], deadline: float) -> None:
        """Server-side apply of a CRD bundle, then wait until each named CRD is Established."""
        self.kubectl("apply", "--server-side", "-f", str(manifest))

        def established() -> bool:
            for name in names:
                crd = self.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = crd.get("status", {}).get("conditions") or []
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    return False
            return True

        self._wait(f"CRDs of {manifest.name}", established, deadline, interval=0.5)

    def _loopback_cert(self, directory: str, cn: str) -> Path:
        """A key and certificate of this control plane's CA for 127.0.0.1 and localhost, usable by a
        server and as a client, with the CA beside them (ca.crt, tls.crt, tls.key)."""
        certs = self._p(directory)
        certs.mkdir(exist_ok=True)
        pki = self._p("pki")
        (certs / "tls.ext").write_text(
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
        )
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={cn}", cwd=certs,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", "tls.csr", "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-days", "3650", "-extfile", "tls.ext", "-out", "tls.crt", cwd=certs,
        )  # fmt: skip
        shutil.copy(pki / "ca.crt", certs / "ca.crt")
        return certs

    def _register_api_service(self, name: str, group: str, version: str, port: int) -> None:
        """An aggregated API on loopback, behind an ExternalName Service (see start_prometheus_adapter)."""
        objs = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "kube-system"},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "ports": [{"name": "https", "port": port}],
                },
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"{version}.{group}"},
                "spec": {
                    "group": group,
                    "version": version,
                    "service": {"name": name, "namespace": "kube-system", "port": port},
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ]
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        )

    def start_keda(self, *, timeout: float = 120.0) -> None:
        """Install KEDA's CRDs (from the pinned module) and run its operator and metrics server on
        loopback, the metrics server registered as external.metrics.k8s.io/v1beta1.

        The two talk gRPC over mutual TLS with a certificate of this control plane's CA, in place of
        the certificates KEDA's operator rotates into a Secret in a real install; its admission
        webhooks are not run (they only validate ScaledObjects). The HPAs KEDA creates are scaled
        by the kube-controller-manager as any other.
        """
        binaries = ensure_binaries(("keda-operator", "keda-adapter"))
        deadline = time.monotonic() + timeout
        self._install_crds(
            binaries["keda-operator"].parent / "keda-crds.yaml",
            [
                "scaledobjects.keda.sh",
                "triggerauthentications.keda.sh",
                "cloudeventsources.eventing.keda.sh",
                "clustercloudeventsources.eventing.keda.sh",
            ],
            deadline,
        )
        self.kubectl("create", "namespace", "keda", check=False)
        certs = self._loopback_cert("keda-certs", "keda")
        grpc, health, metrics, adapter = _free_port(), _free_port(), _free_port(), _free_port()
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": "keda",
            "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda",
        }
        self._spawn(
            "keda-operator",
            [
                str(binaries["keda-operator"]),
                "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{metrics}",
                f"--health-probe-bind-address=127.0.0.1:{health}",
                f"--metrics-service-bind-address=127.0.0.1:{grpc}",
                f"--cert-dir={certs}",
                f"--ca-dir={certs}",
                "--enable-cert-rotation=false",
                "--enable-webhook-patching=false",
                "--enable-apiservice-patching=false",
            ],
            env=env,
        )
        self._wait("keda-operator", lambda: self._http_ok(f"http://127.0.0.1:{health}/readyz"), deadline, 0.5)
        self._spawn(
            "keda-adapter",
            [
                str(binaries["keda-adapter"]),
                f"--lister-kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={adapter}",
                f"--cert-dir={certs}",
                f"--metrics-service-address=127.0.0.1:{grpc}",
                "--metrics-service-grpc-authority=localhost",
            ],
            env=env,
        )
        self._register_api_service("keda-metrics-apiserver", "external.metrics.k8s.io", "v1beta1", adapter)
        self._wait(
            "keda-adapter",
            lambda: self._api_ok("/apis/external.metrics.k8s.io/v1beta1"),
            deadline,
            interval=0.5,
        )

    def stop_keda(self) -> None:
        """Unregister external.metrics.k8s.io and stop KEDA (see stop_prometheus_adapter for why)."""
        self.kubectl("delete", "apiservice", "v1beta1.external.metrics.k8s.io", "--ignore-not-found")
        self.kubectl("delete", "service", "keda-metrics-apiserver", "-n", "kube-system", "--ignore-not-found")
        # KEDA's operator removes the finalizer it puts on each ScaledObject: deleted after it stops,
        # the objects of namespaces still being deleted would keep the CRDs below Terminating, and
        # still served, for ever.
        self.kubectl("delete", "scaledobjects", "--all", "-A", "--timeout=60s", check=False)
        for c in [c for c in self._components if c.name in ("keda-adapter", "keda-operator")]:
            self._terminate(c)
            self._components.remove(c)
        left = self.kubectl("get", "scaledobjects", "-A", "-o", "json", check=False)
        for obj in json.loads(left.stdout)["items"] if left.returncode == 0 else []:
            meta = obj["metadata"]
            self.kubectl(
                "patch", "scaledobject", meta["name"], "-n", meta["namespace"], "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
        # Uninstalled, so that later tests see a cluster without KEDA (the operator renders HPAs).
        crds = binary_path("keda-operator").parent / "keda-crds.yaml"
        self.kubectl("delete", "-f", str(crds), "--ignore-not-found", "--timeout=60s", check=False)

    def start_traefik(
        self,
        *,
        namespace: str = "gateway",
        hold_seconds: int = 15,
        retry_after_seconds: int = 30,
        timeout: float = 120.0,
    ) -> Gateway:
        """Install the Gateway API CRDs (the pinned sigs.k8s.io/gateway-api module's standard channel)
        and run Traefik on loopback as their implementation, with a GatewayClass `traefik` and a
        Gateway `gateway` in `namespace` whose one listener is Traefik's `web` entry point.

        Traefik reads the API with a ServiceAccount token (it takes no kubeconfig), serves its
        Prometheus metrics on their own port, and runs the `hold` middleware (gateway/traefik/hold)
        on every request: a backend with no ready pod holds the request up to `hold_seconds`, then
        answers 503 with Retry-After.
        """
        binary = ensure_binaries(("traefik",))["traefik"]
        deadline = time.monotonic() + timeout
        self._install_crds(
            binary.parent / "gateway-api-crds.yaml",
            [f"{kind}.gateway.networking.k8s.io" for kind in ("gatewayclasses", "gateways", "httproutes")],
            deadline,
        )
        self.kubectl("create", "serviceaccount", "traefik", "-n", "kube-system", check=False)
        self.kubectl(
            "create", "clusterrolebinding", "traefik", "--clusterrole=cluster-admin",
            "--serviceaccount=kube-system:traefik", check=False,
        )  # fmt: skip
        work = self._p("traefik")
        plugin = work / "plugins-local" / "src" / "pagoda.dev" / "hold"
        shutil.copytree(HERE.parents[1] / "gateway" / "traefik" / "hold", plugin, dirs_exist_ok=True)
        token = self.kubectl(
            "create", "token", "traefik", "-n", "kube-system", "--duration=48h"
        ).stdout.strip()
        (work / "token").write_text(token)
        web, metrics, ping = _free_port(), _free_port(), _free_port()
        (work / "dynamic.yml").write_text(
            json.dumps(
                {
                    "http": {
                        "middlewares": {
                            "hold": {
                                "plugin": {
                                    "hold": {
                                        "holdSeconds": hold_seconds,
                                        "retryAfterSeconds": retry_after_seconds,
                                    }
                                }
                            }
                        }
                    }
                }
            )
        )
        static = {
            "entryPoints": {
                "web": {"address": f"127.0.0.1:{web}", "http": {"middlewares": ["hold@file"]}},
                "metrics": {"address": f"127.0.0.1:{metrics}"},
                "ping": {"address": f"127.0.0.1:{ping}"},
            },
            "ping": {"entryPoint": "ping"},
            "metrics": {
                "prometheus": {"entryPoint": "metrics", "addServicesLabels": True, "addRoutersLabels": True}
            },
            "experimental": {"localPlugins": {"hold": {"moduleName": "pagoda.dev/hold"}}},
            "providers": {
                "file": {"filename": str(work / "dynamic.yml")},
                "kubernetesGateway": {
                    "endpoint": self.server,
                    "token": token,
                    "certAuthFilePath": str(self.ca_file),
                    "statusAddress": {"ip": "127.0.0.1"},
                },
            },
            "log": {"level": "INFO"},
        }
        (work / "traefik.yml").write_text(json.dumps(static))
        self._spawn("traefik", [str(binary), f"--configFile={work / 'traefik.yml'}"], cwd=work)
        self._wait("traefik", lambda: self._http_ok(f"http://127.0.0.1:{ping}/ping"), deadline, interval=0.5)
        self.kubectl("create", "namespace", namespace, check=False)
        objs = [
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GatewayClass",
                "metadata": {"name": "traefik"},
                "spec": {"controllerName": "traefik.io/gateway-controller"},
            },
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": "gateway", "namespace": namespace},
                "spec": {
                    "gatewayClassName": "traefik",
                    # Traefik binds a listener to the entry point on the same port.
                    "listeners": [
                        {
                            "name": "web",
                            "protocol": "HTTP",
                            "port": web,
                            "allowedRoutes": {"namespaces": {"from": "All"}},
                        }
                    ],
                },
            },
        ]
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        )

        def programmed() -> bool:
            gateway = self.api(
                "GET", f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/gateways/gateway"
            )
            conditions = gateway.get("status", {}).get("conditions") or []
            return any(c["type"] == "Programmed" and c["status"] == "True" for c in conditions)

        self._wait("traefik", programmed, deadline, interval=0.5)
        return Gateway(
            name="gateway",
            namespace=namespace,
            url=f"http://127.0.0.1:{web}",
            metrics_url=f"http://127.0.0.1:{metrics}/metrics",
        )

    def stop_traefik(self) -> None:
        """Stop Traefik and uninstall the Gateway API, so that later tests see a cluster without it."""
        for c in [c for c in self._components if c.name == "traefik"]:
            self._terminate(c)
            self._components.remove(c)
        crds = binary_path("traefik").parent / "gateway-api-crds.yaml"
        self.kubectl("delete", "-f", str(crds), "--ignore-not-found", "--timeout=60s", check=False)

    def node_ready(self, name: str) -> bool:
        try:
            node = self.api("GET", f"/api/v1/nodes/{name}", timeout=5)
        except (urllib.error.URLError, OSError):
            return False
        conds = node.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _main() -> None:  # pragma: no cover - manual smoke run
    """`python3 controlplane.py` starts a cluster and waits for Ctrl-C."""
    with ControlPlane() as cp:
        print(
            textwrap.dedent(f"""\
                control plane up in {cp.start_seconds:.1f}s
                export KUBECONFIG={cp.kubeconfig}
                logs: {cp.logs_dir}
                Ctrl-C to stop"""),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    _main()
