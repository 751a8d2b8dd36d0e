"""pagoda-operator as a process on the host, pointed at the loopback control plane by a kubeconfig.

The in-cluster `kubernetes` Service points nowhere on loopback, so the operator runs here, the way
`pagoda-operator` runs in its pod but with the ServiceAccount token in a kubeconfig. Each start
writes its own log, so that a test can read what the current process did.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from child_process import ChildProcess
from loopback_client import free_port

# The ServiceAccount of manifests/, whose token the operator runs with.
OPERATOR_NAMESPACE = "pagoda-system"
OPERATOR_ACCOUNT = "pagoda-operator"
# kopf's words for a handler that raised something other than kopf's own errors (with which the
# operator reports a refusal), the operator's for a peering object it could not create, and the
# apiserver's for a request that RBAC refused.
_FAILURE = re.compile(
    rf"(Handler|Timer) '\w+' failed with an exception|Resync failed with an exception"
    "|Cannot create kopf's KopfPeering"
    rf"|system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}\\?\" cannot"
)
# In-cluster settings would win over the kubeconfig if the tests themselves run in a pod.
_IN_CLUSTER_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        logs_dir: Path,
        *,
        resync_seconds: float,
        namespaces: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
    ):
        self.kubeconfig = kubeconfig
        # The namespaces it watches (--namespace, which argparse refuses beside --all-namespaces);
        # none: every namespace.
        self.namespaces = namespaces
        self.args = args  # more flags, as an install's values would set them
        self.logs_dir = logs_dir
        self.resync_seconds = resync_seconds
        self.child: ChildProcess | None = None
        self.log_path: Path | None = None
        self.starts = 0

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        self.log_path = self.logs_dir / f"operator-{self.starts}.log"
        health_url = f"http://127.0.0.1:{free_port()}/healthz"
        env = {k: v for k, v in os.environ.items() if k not in _IN_CLUSTER_VARIABLES}
        env.update(KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        command = [
            sys.executable,
            "-m",
            "pagoda_operator.cli",
            *([f"--namespace={n}" for n in self.namespaces] or ["--all-namespaces"]),
            f"--liveness={health_url}",
            "--metrics-port=0",
            f"--resync-seconds={self.resync_seconds}",
            *self.args,
        ]
        self.child = ChildProcess(command, self.log_path, env)
        try:
            self.child.wait_http_ok(health_url, timeout)
        except AssertionError:
            self.stop()
            raise

    def stop(self) -> None:
        child, self.child = self.child, None
        if child is not None:
            child.stop(grace=15.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def handled(self, namespace: str, name: str, message: str) -> int:
        """How often the current process logged `message` (e.g. "Resync succeeded") for an object."""
        return self.log().count(f"[{namespace}/{name}] {message}")

    def failures(self) -> list[str]:
        """Log lines, over every start, of handlers that crashed or of requests that RBAC refused."""
        text = "\n".join(log.read_text(errors="replace") for log in self.logs_dir.glob("operator-*.log"))
        return [line for line in text.splitlines() if _FAILURE.search(line)]
