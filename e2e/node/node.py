"""A real worker node for the loopback control plane: containerd, runc, CNI, kubelet, kube-proxy.

The node lives in its own network namespace, like a machine on a network: a veth pair joins it
to the host (host side ``.1``, node side ``.2`` of a /30 the harness picks), the CNI bridge and
kube-proxy's rules live inside it, and the host gets routes to the pod and Service ranges through
it, so a test reaches a pod IP or a ClusterIP as a client in the cluster's network would. The
kubelet registers as ``system:node:<name>`` with a certificate from the control plane's CA; the
apiserver (bound to 127.0.0.1) is forwarded onto the host side of the veth so that the kubelet,
kube-proxy and pods (through the ``kubernetes`` Service) reach it.

Images come in as OCI archives (``import_image``); the sandbox (pause) image is built here. The
containerd content store stays in ``${PAGODA_NODE_CACHE:-~/.cache/pagoda-node}`` between runs so a
warm run does not import a multi-gigabyte image again; a lock keeps to one node per machine.

Needs root, Linux, and what ``e2e/node/prepare.sh`` installs and builds. Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREPARE_SH = HERE / "prepare.sh"
FORWARD_PY = HERE / "tcp_forward.py"
CNI_BIN_DIR = "/usr/lib/cni"
POD_SUBNET = "10.244.0.0/24"  # inside the control plane's POD_CIDR; kwok's fake pods use 10.244.1+
# /30 links between the host and the node are taken from here (a range nothing else routes).
LINK_RANGE = ipaddress.ip_network("10.213.0.0/16")
REQUIRED_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "ip",
    "nsenter",
    "iptables",
    "buildah",
    "openssl",
)


class NodeError(RuntimeError):
    """The node failed to start, or a component died."""


def node_cache() -> Path:
    env = os.environ.get("PAGODA_NODE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pagoda-node"


def unavailable_reason() -> str | None:
    """Why this machine cannot run the node, in one sentence; None when it can."""
    if os.uname().sysname != "Linux":
        return "a real node needs Linux (network namespaces, cgroups, runc)"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, network namespaces); run the suite as root"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing or not Path(CNI_BIN_DIR, "bridge").exists():
        return (
            f"the node's tools are missing ({', '.join(missing) or 'CNI plugins'}); run e2e/node/prepare.sh"
        )
    return None


def _run(*argv: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def stale_images(listing: str, keep: str) -> list[str]:
    """The image records to remove once ``keep`` is imported, from ``ctr images ls`` output.

    Other tags of ``keep``'s repository are older builds. The CRI plugin also names every image
    it sees by its id (``sha256:<config digest>``) pointing at the same manifest; such an alias
    outlives its tag and would keep a multi-gigabyte build forever, so an alias goes once no
    tagged image shares its manifest.
    """
    repository = keep.rpartition(":")[0]
    # Columns: REF TYPE DIGEST SIZE PLATFORMS LABELS.
    records = [(cols[0], cols[2]) for cols in map(str.split, listing.splitlines()[1:]) if len(cols) > 2]
    stale = [name for name, _ in records if name.rpartition(":")[0] == repository and name != keep]
    kept = {digest for name, digest in records if not name.startswith("sha256:") and name not in stale}
    return stale + [name for name, digest in records if name.startswith("sha256:") and digest not in kept]


def pause_image() -> tuple[str, Path]:
    """The sandbox image's reference and OCI archive, built by prepare.sh (cached by content)."""
    digest = hashlib.sha256((HERE / "pause" / "main.go").read_bytes()).hexdigest()[:16]
    return f"localhost/pagoda-pause:{digest}", node_cache() / f"pause-{digest}.oci.tar"


NODE_DIR_PREFIX = "pagoda-node-"
NETNS_PREFIX = "pagoda-"


def _sweep_stale_nodes() -> None:
    """What a node whose test process was killed left behind: its pods' processes (they outlive
    their containerd shims), the shims, its network namespace (with its link and routes) and its
    mounts. Called with the machine's node lock held, so nothing found is in use."""
    stale_dirs = [p for p in Path(tempfile.gettempdir()).glob(NODE_DIR_PREFIX + "*") if p.is_dir()]
    victims = set()
    for cgroup in (Path("/sys/fs/cgroup/pids/kubepods"), Path("/sys/fs/cgroup/kubepods")):
        for procs in cgroup.rglob("cgroup.procs") if cgroup.is_dir() else ():
            victims.update(int(pid) for pid in procs.read_text().split())
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"containerd-shim-runc-v2") and any(
                str(d).encode() in arg for d in stale_dirs for arg in argv
            ):
                victims.add(int(proc.name))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NETNS_PREFIX):
            _run("ip", "netns", "del", name, check=False)
    for stale in stale_dirs:
        _run("umount", "-R", "-l", str(stale / "kubelet"), check=False)
        for mount in sorted(Node._mounts_under(stale), reverse=True):
            _run("umount", "-l", mount, check=False)
        shutil.rmtree(stale, ignore_errors=True)


class Node:
    """One worker node registered with ``cp`` (a started ControlPlane)."""

    def __init__(self, cp, *, name: str = "pagoda-node", start_timeout: float = 180.0) -> None:
        self.cp = cp
        self._cpmod = sys.modules[type(cp).__module__]  # controlplane.py, however it was loaded
        self.name = name
        self.start_timeout = start_timeout
        self.netns = f"{NETNS_PREFIX}{os.getpid()}"
        self.host_ip = ""
        self.node_ip = ""
        self.dir: Path | None = None
        self._components: list = []
        self._lock = None
        self._host_veth = f"pgd{os.getpid() % 100000}"
        self._routes: list[str] = []

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Node:
        reason = unavailable_reason()
        if reason:
            raise NodeError(reason)
        cache = node_cache()
        cache.mkdir(parents=True, exist_ok=True)
        self._lock = open(cache / ".node.lock", "w")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise NodeError(f"another node of this machine holds {cache / '.node.lock'}") from None
        _sweep_stale_nodes()
        # Short: containerd's socket path must fit in a unix socket address.
        self.dir = Path(tempfile.mkdtemp(prefix=NODE_DIR_PREFIX))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        bins = self._cpmod.ensure_binaries(("kubelet", "kube-proxy"))
        self._network()
        self._certificates()
        self._spawn_containerd()
        self._wait(
            "containerd",
            lambda: _run("ctr", "--address", self.containerd_socket, "version", check=False).returncode == 0,
            deadline,
        )
        # Containers a killed earlier run left in the kept containerd root, and their networks.
        self._remove_containers()
        ref, archive = pause_image()
        self.import_image(ref, archive)
        self._forward_apiserver()
        self._spawn_kubelet(bins["kubelet"])
        self._wait("kubelet", lambda: self.cp.node_ready(self.name), deadline)
        self._spawn_kube_proxy(bins["kube-proxy"])
        self._wait(
            "kube-proxy",
            lambda: (
                self._in_node("iptables", "-t", "nat", "-S", "KUBE-SERVICES", check=False).returncode == 0
            ),
            deadline,
        )

    def stop(self) -> None:
        """Stop every pod's containers, the components, the network; remove the work directory."""
        kubelet = [c for c in self._components if c.name in ("kubelet", "kube-proxy")]
        for c in kubelet:
            self.cp._terminate(c)
        if self.dir is not None and Path(self.containerd_socket).exists():
            self._remove_containers()
        for c in reversed(self._components):
            self.cp._terminate(c)
        self._components.clear()
        for route in self._routes:
            _run("ip", "route", "del", route, check=False)
        self._routes.clear()
        _run("ip", "netns", "del", self.netns, check=False)
        if self.dir is not None:
            _run("umount", "-R", "-l", str(self.dir / "kubelet"), check=False)
            for mount in sorted(self._mounts_under(self.dir), reverse=True):
                _run("umount", "-l", mount, check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ----------------------------------------------------------------- images
    @property
    def containerd_socket(self) -> str:
        assert self.dir is not None
        return str(self.dir / "containerd.sock")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", self.containerd_socket, "--namespace", "k8s.io", *args, check=check)

    def import_image(self, ref: str, archive: Path) -> None:
        """Make ``ref`` available to pods (imagePullPolicy Never/IfNotPresent) unless it already is."""
        if ref in self.ctr("images", "ls", "-q").stdout.split():
            return
        if not archive.is_file():
            raise NodeError(
                f"image archive {archive} is missing; run images/build.sh and e2e/node/prepare.sh"
            )
        self.ctr("images", "import", str(archive))
        # Older builds of the same image are gigabytes each; --sync has containerd collect their
        # content and snapshots before the next test needs the disk.
        stale = stale_images(self.ctr("images", "ls").stdout, ref)
        if stale:
            self.ctr("images", "rm", "--sync", *stale, check=False)
        if ref not in self.ctr("images", "ls", "-q").stdout.split():
            raise NodeError(f"importing {archive} did not give image {ref}")

    # ----------------------------------------------------------------- network
    def _network(self) -> None:
        used = {
            ipaddress.ip_network(r.split()[0], strict=False)
            for r in _run("ip", "-4", "route", "show", "table", "all").stdout.splitlines()
            if r and r.split()[0][0].isdigit()
        }
        links = list(LINK_RANGE.subnets(new_prefix=30))
        random.shuffle(links)
        link = next(n for n in links if not any(n.overlaps(u) for u in used))
        host, node = list(link.hosts())
        self.host_ip, self.node_ip = str(host), str(node)
        _run("ip", "netns", "add", self.netns)
        _run(
            "ip", "link", "add", self._host_veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns
        )
        _run("ip", "addr", "add", f"{host}/30", "dev", self._host_veth)
        _run("ip", "link", "set", self._host_veth, "up")
        self._in_node("ip", "link", "set", "lo", "up")
        self._in_node("ip", "addr", "add", f"{node}/30", "dev", "eth0")
        self._in_node("ip", "link", "set", "eth0", "up")
        self._in_node("ip", "route", "add", "default", "via", str(host))
        self._in_node("sysctl", "-qw", "net.ipv4.ip_forward=1")
        for dest in (POD_SUBNET, self._cpmod.SERVICE_CIDR):
            _run("ip", "route", "add", dest, "via", str(node))
            self._routes.append(dest)

    def _in_node(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("nsenter", f"--net=/run/netns/{self.netns}", "--", *argv, check=check)

    def _forward_apiserver(self) -> None:
        """The apiserver on the host side of the link, and as the ``kubernetes`` Service's endpoint."""
        port = int(self.cp.server.rsplit(":", 1)[1])
        self._spawn(
            "apiserver-forward",
            [
                shutil.which("python3") or "python3",
                str(FORWARD_PY),
                f"{self.host_ip}:{port}",
                f"127.0.0.1:{port}",
            ],
            netns=False,
        )
        self.apiserver_url = f"https://{self.host_ip}:{port}"
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "e2e-node.pagoda.dev",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.host_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(slice_))

    # ----------------------------------------------------------------- certificates
    def _certificates(self) -> None:
        assert self.dir is not None
        pki = self.dir / "pki"
        pki.mkdir()
        ca_crt, ca_key = self.cp.ca_file, str(Path(self.cp.ca_file).with_name("ca.key"))
        for user, subject in (
            ("kubelet", f"/O=system:nodes/CN=system:node:{self.name}"),
            ("kube-proxy", "/CN=system:kube-proxy"),
        ):
            _run(
                "openssl",
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(pki / f"{user}.key"),
                "-out",
                str(pki / f"{user}.csr"),
                "-subj",
                subject,
            )
            (pki / "client.ext").write_text(
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
            )
            _run(
                "openssl",
                "x509",
                "-req",
                "-in",
                str(pki / f"{user}.csr"),
                "-CA",
                ca_crt,
                "-CAkey",
                ca_key,
                "-CAcreateserial",
                "-CAserial",
                str(pki / "ca.srl"),
                "-days",
                "30",
                "-extfile",
                str(pki / "client.ext"),
                "-out",
                str(pki / f"{user}.crt"),
            )

    def _kubeconfig(self, user: str) -> Path:
        assert self.dir is not None
        pki = self.dir / "pki"
        port = int(self.cp.server.rsplit(":", 1)[1])
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            # The serving certificate names 127.0.0.1, which is where the forward ends.
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": f"https://{self.host_ip}:{port}",
                        "certificate-authority": self.cp.ca_file,
                        "tls-server-name": "127.0.0.1",
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": str(pki / f"{user}.crt"),
                        "client-key": str(pki / f"{user}.key"),
                    },
                }
            ],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}],
            "current-context": "c",
        }
        path = self.dir / f"{user}.kubeconfig"
        path.write_text(json.dumps(cfg))
        return path

    # ----------------------------------------------------------------- components
    def _spawn(self, name: str, argv: list[str], netns: bool = True):
        if netns:
            argv = ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]
        c = self.cp._spawn(name, argv)
        # The node stops its own components, in its own order.
        self.cp._components.remove(c)
        self._components.append(c)
        return c

    def _wait(self, name: str, ok, deadline: float) -> None:
        while True:
            for c in self._components:
                if c.proc.poll() is not None:
                    raise NodeError(
                        f"{c.name} exited with {c.proc.returncode}; log {c.log}:\n" + self.cp.log_tail(c.name)
                    )
            with contextlib.suppress(OSError, ValueError, KeyError, subprocess.SubprocessError):
                if ok():
                    return
            if time.monotonic() > deadline:
                raise NodeError(
                    f"timed out waiting for {name}; log in {self.cp.logs_dir}:\n" + self.cp.log_tail(name)
                )
            time.sleep(0.5)

    def _spawn_containerd(self) -> None:
        assert self.dir is not None
        root = node_cache() / "containerd"
        cni_conf = self.dir / "cni"
        cni_conf.mkdir()
        (cni_conf / "10-pagoda.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "pagoda",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.dir / "ipam"),
                            },
                        }
                    ],
                }
            )
        )
        pause_ref, _ = pause_image()
        config = f"""\
version = 2
root = "{root}"
state = "{self.dir / "containerd-state"}"
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_ref}"
  # Without these two runc fails on this kind of host with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
"""
        path = self.dir / "containerd.toml"
        path.write_text(config)
        self._spawn("containerd", ["containerd", "--config", str(path)])

    def _spawn_kubelet(self, kubelet: Path) -> None:
        assert self.dir is not None
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This host runs cgroup v1, and containerd 1.x cannot tell the kubelet its driver.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            # Reachable only from this host; the apiserver calls it for logs and exec.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "resolvConf": "/etc/resolv.conf",
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            # Imported images cannot be pulled again; never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "podLogsDir": str(self.dir / "pod-logs"),
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
        }
        path = self.dir / "kubelet.yaml"
        path.write_text(json.dumps(config))
        self._spawn(
            "kubelet",
            [
                str(kubelet),
                f"--config={path}",
                f"--kubeconfig={self._kubeconfig('kubelet')}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                "--v=1",
            ],
        )

    def _spawn_kube_proxy(self, kube_proxy: Path) -> None:
        assert self.dir is not None
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self._kubeconfig("kube-proxy"))},
            "hostnameOverride": self.name,
            "clusterCIDR": POD_SUBNET,
            # Leave the kernel's conntrack table size alone: it is not this namespace's to set.
            "conntrack": {"maxPerCore": 0},
            "metricsBindAddress": "127.0.0.1:10249",
            "healthzBindAddress": "127.0.0.1:10256",
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(json.dumps(config))
        self._spawn("kube-proxy", [str(kube_proxy), f"--config={path}", "--v=1"])

    # ----------------------------------------------------------------- teardown
    def _remove_containers(self) -> None:
        # Pod network namespaces are pinned by files the CRI plugin made; without the kubelet to
        # tear the sandboxes down they would outlive the containers.
        pod_netns = set()
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            info = self.ctr("containers", "info", container, check=False).stdout
            with contextlib.suppress(ValueError, KeyError, TypeError):
                for ns in json.loads(info)["Spec"]["linux"]["namespaces"]:
                    if ns["type"] == "network" and ns.get("path", "").startswith("/var/run/netns/"):
                        pod_netns.add(ns["path"].rsplit("/", 1)[1])
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
            for task in tasks:
                self.ctr("tasks", "delete", "-f", task, check=False)
            if not tasks:
                break
            time.sleep(0.5)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)
        for name in pod_netns:
            _run("ip", "netns", "del", name, check=False)

    @staticmethod
    def _mounts_under(path: Path) -> list[str]:
        prefix = str(path) + "/"
        with open("/proc/self/mounts") as f:
            return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
