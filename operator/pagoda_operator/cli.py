"""`pagoda-operator`: runs the kopf handlers with peering, a liveness endpoint and metrics."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import kopf
from prometheus_client import start_http_server

from pagoda_operator import settings
from pagoda_operator.names import DEFAULT_OPERATOR_NAMESPACE

PEERING_NAME = "pagoda-operator"


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


def label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a label KEY=VALUE, such as release=kube-prometheus-stack"
        )
    return key, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pagoda-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch this namespace (repeatable; globs allowed)",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)"
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: run even if another operator is active (tests, local runs)",
    )
    p.add_argument("--peering-name", default=PEERING_NAME, help="the ClusterKopfPeering/KopfPeering object")
    p.add_argument("--priority", type=int, default=0, help="peering priority; the highest active one works")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: none)")
    p.add_argument(
        "--resync-seconds",
        type=positive_seconds,
        default=30.0,
        help="reconcile every InferenceService again this often, undoing changes made to its children",
    )
    p.add_argument(
        "--prometheus-url",
        default=settings.DEFAULT_PROMETHEUS_URL,
        help="the Prometheus KEDA's ScaledObjects query for queue depth and gateway demand",
    )
    p.add_argument(
        "--gateway-request-counter",
        default=settings.DEFAULT_REQUEST_COUNTER,
        help="PromQL series selector of the gateway's request counter per HTTPRoute rule, with "
        "{namespace}, {route} and {rules}: what wakes a variant scaled to zero (default: Traefik's)",
    )
    p.add_argument(
        "--runtime-image",
        default=os.environ.get("PAGODA_RUNTIME_IMAGE") or settings.DEFAULT_RUNTIME_IMAGE,
        help="the pagoda-runtime image of every InferenceService that names none (spec.runtime.image); "
        "a new value rolls those services one workload at a time (default: $PAGODA_RUNTIME_IMAGE, "
        f"else {settings.DEFAULT_RUNTIME_IMAGE})",
    )
    p.add_argument(
        "--service-monitor-label",
        type=label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of every ServiceMonitor, for a Prometheus that selects them by label (repeatable; "
        "kube-prometheus-stack selects release=<its release name>)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # kopf's formatter prefixes each line with the [namespace/name] of the object it is about.
    kopf.configure(verbose=args.verbose, log_prefix=True)
    settings.configure(
        settings.OperatorSettings(
            runtime_image=args.runtime_image,
            service_monitor_labels=dict(args.service_monitor_label),
            keda=settings.KedaSettings(args.prometheus_url, args.gateway_request_counter),
            namespaces=tuple(args.namespace),
            # The downward API's metadata.namespace (charts/pagoda, manifests/).
            operator_namespace=os.environ.get("POD_NAMESPACE") or DEFAULT_OPERATOR_NAMESPACE,
        )
    )
    from pagoda_operator import handlers  # importing registers the handlers with kopf

    handlers.schedule_resync(args.resync_seconds)

    if args.metrics_port:
        start_http_server(args.metrics_port)
    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=args.standalone,
            # A peering name makes kopf's peering mandatory, and kopf pauses a standalone operator
            # whose mandatory peering it never sets up: name one only where peering runs.
            peering_name=None if args.standalone else args.peering_name,
            priority=args.priority,
            liveness_endpoint=args.liveness or None,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
