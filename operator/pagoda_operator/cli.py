"""`pagoda-operator`: runs the kopf handlers with peering, a liveness endpoint and metrics."""

from __future__ import annotations

import argparse
import asyncio
import sys

import kopf
from prometheus_client import start_http_server

from pagoda_operator.scaled_object import DEFAULT_PROMETHEUS_URL, DEFAULT_REQUEST_COUNTER, KedaSettings

PEERING_NAME = "pagoda-operator"


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


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
        default=DEFAULT_PROMETHEUS_URL,
        help="the Prometheus KEDA's ScaledObjects query for queue depth and gateway demand",
    )
    p.add_argument(
        "--gateway-request-counter",
        default=DEFAULT_REQUEST_COUNTER,
        help="PromQL series selector of the gateway's request counter per HTTPRoute rule, with "
        "{namespace}, {route} and {rules}: what wakes a variant scaled to zero (default: Traefik's)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # kopf's formatter prefixes each line with the [namespace/name] of the object it is about.
    kopf.configure(verbose=args.verbose, log_prefix=True)
    from pagoda_operator import handlers  # importing registers the handlers with kopf
    from pagoda_operator.reconcile import configure_autoscaling

    handlers.schedule_resync(args.resync_seconds)
    configure_autoscaling(KedaSettings(args.prometheus_url, args.gateway_request_counter))

    if args.metrics_port:
        start_http_server(args.metrics_port)
    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=args.standalone,
            peering_name=args.peering_name,
            priority=args.priority,
            liveness_endpoint=args.liveness or None,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
