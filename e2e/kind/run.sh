#!/usr/bin/env bash
# End to end on kind: build both images, install Pagoda with manifests/, serve the bundled model on
# the CPU, get a completion through the Service, roll the Deployment while a client streams, and
# check that no request was lost. Needs docker (a running engine), kind and kubectl on PATH.
# Usage: e2e/kind/run.sh [--keep]   (--keep leaves the cluster up for inspection)
set -euo pipefail
cd "$(dirname "$0")/../.."

cluster=${PAGODA_KIND_CLUSTER:-pagoda-e2e}
tag=e2e-$(git rev-parse --short HEAD 2>/dev/null || echo local)
keep=${1:-}
namespace=pagoda-e2e
example=manifests/examples/cpu-smollm2.yaml

for tool in docker kind kubectl python3; do
    command -v "$tool" >/dev/null || { echo "e2e: $tool is not on PATH; install it first" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e: no Docker engine answers; start one first" >&2; exit 2; }

cleanup() {
    [[ -n ${port_forward_pid:-} ]] && kill "$port_forward_pid" 2>/dev/null || true
    if [[ $keep != --keep ]]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

echo "e2e: building images (tag $tag)"
docker build -q -f images/runtime.Dockerfile -t "pagoda-runtime:$tag" .
docker build -q -f images/operator.Dockerfile -t "pagoda-operator:$tag" .

kind get clusters | grep -qx "$cluster" || kind create cluster --name "$cluster" --wait 120s
kind load docker-image --name "$cluster" "pagoda-runtime:$tag" "pagoda-operator:$tag"

echo "e2e: installing the operator"
workdir=$(mktemp -d)
kubectl apply -k manifests/
kubectl -n pagoda-system set image deployment/pagoda-operator "*=pagoda-operator:$tag"
kubectl -n pagoda-system rollout status deployment/pagoda-operator --timeout=180s

echo "e2e: applying $example"
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f -
sed "s#image: .*pagoda-runtime.*#image: pagoda-runtime:$tag#" "$example" | kubectl -n "$namespace" apply -f -
name=$(kubectl -n "$namespace" get infsvc -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$namespace" wait "infsvc/$name" --for=condition=Ready --timeout=600s

kubectl -n "$namespace" port-forward "svc/$name" 18000:8000 >/dev/null 2>&1 &
port_forward_pid=$!
sleep 3

echo "e2e: one completion through the Service"
python3 e2e/kind/stream_client.py --url http://127.0.0.1:18000 --once

echo "e2e: rolling the Deployment while a client streams"
python3 e2e/kind/stream_client.py --url http://127.0.0.1:18000 --streams 4 --duration 90 \
    >"$workdir/client.log" 2>&1 &
client_pid=$!
sleep 10
for deploy in $(kubectl -n "$namespace" get deploy -l "pagoda.dev/inference-service=$name" -o name); do
    kubectl -n "$namespace" rollout restart "$deploy"
    kubectl -n "$namespace" rollout status "$deploy" --timeout=600s
done
wait "$client_pid" || { cat "$workdir/client.log"; echo "e2e: requests were lost during the roll" >&2; exit 1; }
cat "$workdir/client.log"
echo "e2e: passed"
