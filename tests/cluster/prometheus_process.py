"""A real Prometheus on loopback that scrapes given targets as if they were pods of a cluster.

Kubernetes service discovery cannot reach a runtime on loopback, so each target carries the
namespace and pod labels that kubernetes_sd relabelling would have given it; the adapter rules
map those labels to the pod resource.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
from child_process import ChildProcess
from loopback_client import free_port

ENSURE_PROMETHEUS = Path(__file__).resolve().parents[2] / "e2e" / "controlplane" / "ensure-prometheus.sh"


def ensure_prometheus() -> tuple[str | None, str]:
    """The prometheus binary (installed as Debian's package when root), or None and why not."""
    result = subprocess.run(["bash", str(ENSURE_PROMETHEUS)], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        return None, result.stderr.strip()
    return result.stdout.strip().splitlines()[-1], ""


class PrometheusProcess(ChildProcess):
    def __init__(
        self,
        binary: str,
        jobs: dict[str, dict[str, dict[str, str]]],
        work_dir: Path,
        scrape_interval: str = "1s",
    ) -> None:
        """jobs maps a scrape job's name to its targets: host:port and the labels its series get."""
        self.url = f"http://127.0.0.1:{free_port()}"
        config = {
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [
                        {"targets": [target], "labels": labels} for target, labels in targets.items()
                    ],
                }
                for job, targets in jobs.items()
            ],
        }
        config_file = work_dir / "prometheus.yml"
        config_file.write_text(json.dumps(config, indent=2))  # JSON is YAML
        command = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={work_dir / 'tsdb'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        super().__init__(command, work_dir / "prometheus.log")

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_http_ok(self.url + "/-/ready", timeout)

    def query(self, expr: str) -> list[dict]:
        """The instant vector expr evaluates to now."""
        response = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]
