#!/usr/bin/env bash
# Build the pinned control-plane binaries from the Go module proxy into a per-user cache outside
# the repository:  ${PAGODA_TOOLS_CACHE:-$HOME/.cache/pagoda-tools}/<name>-<version>/<binary>
#
# Usage: e2e/controlplane/build.sh [--print-dir] [NAME...]
#   NAME is one of: kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy
#   etcd kwok prometheus-adapter minio lws-controller helm kstatus-check traefik keda-operator
#   keda-adapter, or the groups `core` (everything the loopback control plane needs), `gateway`
#   (traefik, keda-operator, keda-adapter), `node` (a real worker node, e2e/node: kubelet,
#   kube-proxy) and `all` (default). Only missing binaries are built; a flock serialises concurrent
#   callers.
#   --print-dir prints the cache directory and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$here/versions.env"
cache="${PAGODA_TOOLS_CACHE:-$HOME/.cache/pagoda-tools}"

KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
CORE=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)
NODE=(kubelet kube-proxy)
# traefik: the Gateway API implementation that routes to InferenceServices (the Gateway API CRDs
# from the pinned sigs.k8s.io/gateway-api module beside it); keda-*: KEDA's operator and its
# external-metrics server (its CRDs beside the operator).
GATEWAY=(traefik keda-operator keda-adapter)
# minio: the S3-compatible server the model-cache tests download from; lws-controller: the
# LeaderWorkerSet controller that runs InferenceServices spanning nodes; helm: the chart's tests;
# kstatus-check: what Flux's health checks make of an InferenceService's status.
ALL=("${CORE[@]}" "${NODE[@]}" prometheus-adapter minio lws-controller helm kstatus-check "${GATEWAY[@]}")

version_of() {
  case "$1" in
    kube-*|kubectl|kubelet) echo "$KUBERNETES_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    prometheus-adapter) echo "$PROMETHEUS_ADAPTER_VERSION" ;;
    minio) echo "$MINIO_VERSION" ;;
    lws-controller) echo "$LWS_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    kstatus-check) echo "$KSTATUS_VERSION" ;;
    traefik) echo "$TRAEFIK_VERSION" ;;
    keda-*) echo "$KEDA_VERSION" ;;
    *) echo "unknown binary: $1" >&2; return 1 ;;
  esac
}
path_of() { echo "$cache/$1-$(version_of "$1")/$1"; }

if [ "${1:-}" = "--print-dir" ]; then echo "$cache"; exit 0; fi

want=()
[ $# -eq 0 ] && set -- all
for a in "$@"; do
  case "$a" in
    all) want+=("${ALL[@]}") ;;
    core) want+=("${CORE[@]}") ;;
    node) want+=("${NODE[@]}") ;;
    gateway) want+=("${GATEWAY[@]}") ;;
    *) version_of "$a" >/dev/null; want+=("$a") ;;
  esac
done

missing() { local b; for b in "${want[@]}"; do [ -x "$(path_of "$b")" ] || echo "$b"; done | sort -u; }
if [ -z "$(missing)" ]; then echo "control-plane binaries up to date in $cache"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: Go is required (https://go.dev/dl/)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
BUILDFLAGS=(-trimpath "-ldflags=-s -w")

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  echo "build.sh: another build holds $cache/.build.lock; waiting..."
  flock 9
fi
todo="$(missing)"   # re-check: whoever held the lock may have built them
if [ -z "$todo" ]; then echo "control-plane binaries up to date in $cache"; exit 0; fi

start=$SECONDS
tmp="$(mktemp -d "$cache/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

install_bin() {  # install_bin NAME BUILT_FILE: atomic rename into the versioned cache dir
  local dest; dest="$(path_of "$1")"
  mkdir -p "$(dirname "$dest")"
  chmod 0755 "$2"
  mv -f "$2" "$dest.tmp.$$" && mv -f "$dest.tmp.$$" "$dest"
  echo "  built $dest"
}
has() { grep -qx "$1" <<<"$todo"; }

echo "build.sh: building $(echo "$todo" | tr '\n' ' ')into $cache (go $(go env GOVERSION))"

# The LeaderWorkerSet controller builds beside the others: a Go build does not keep both cores
# busy all the time (the link is single-threaded), so overlapping them saves wall time.
lws_pid=""
if has lws-controller; then
  (
    t=$SECONDS
    mkdir -p "$tmp/lws"
    (cd "$here/lws" && go build "${BUILDFLAGS[@]}" -o "$tmp/lws/lws-controller" sigs.k8s.io/lws/cmd)
    # Its CRDs are installed from the same module version (config/crd/bases).
    lwsdir="$(cd "$here/lws" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)"
    cp "$lwsdir/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$tmp/lws/crd.yaml"
    dest="$(path_of lws-controller)"
    mkdir -p "${dest%/*}"
    mv -f "$tmp/lws/crd.yaml" "${dest%/*}/leaderworkersets.yaml"
    install_bin lws-controller "$tmp/lws/lws-controller"
    echo "  lws-controller $LWS_VERSION: $((SECONDS - t))s"
  ) &
  lws_pid=$!
fi

# Helm and kstatus-check (the chart's and the GitOps tests' tools) likewise, one after the other.
tools_pid=""
if has helm || has kstatus-check; then
  (
    if has helm; then
      t=$SECONDS
      mkdir -p "$tmp/helm"
      GOBIN="$tmp/helm" go install "${BUILDFLAGS[@]}" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
      install_bin helm "$tmp/helm/helm"
      echo "  helm $HELM_VERSION: $((SECONDS - t))s"
    fi
    if has kstatus-check; then
      t=$SECONDS
      (cd "$here/kstatus" && go build "${BUILDFLAGS[@]}" -o "$tmp/kstatus-check" .)
      install_bin kstatus-check "$tmp/kstatus-check"
      echo "  kstatus-check $KSTATUS_VERSION: $((SECONDS - t))s"
    fi
  ) &
  tools_pid=$!
fi

# kube-*: one `go build` for all of them shares compilation of the common packages.
pkgs=()
for b in "${KUBE_BINS[@]}"; do has "$b" && pkgs+=("k8s.io/kubernetes/cmd/$b"); done
if [ ${#pkgs[@]} -gt 0 ]; then
  t=$SECONDS
  mkdir -p "$tmp/kube"
  (cd "$here/kube" && go build "${BUILDFLAGS[@]}" -o "$tmp/kube/" "${pkgs[@]}")
  for p in "${pkgs[@]}"; do install_bin "${p##*/}" "$tmp/kube/${p##*/}"; done
  echo "  kubernetes $KUBERNETES_VERSION: $((SECONDS - t))s"
fi

if has etcd; then
  t=$SECONDS
  (cd "$here/etcd" && go build "${BUILDFLAGS[@]}" -o "$tmp/etcd" .)
  install_bin etcd "$tmp/etcd"
  echo "  etcd $ETCD_VERSION: $((SECONDS - t))s"
fi

if has kwok; then
  t=$SECONDS
  mkdir -p "$tmp/kwok"
  GOBIN="$tmp/kwok" go install "${BUILDFLAGS[@]}" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # The kwok binary has no built-in stages; ship the upstream "fast" set (node-initialize,
  # node-heartbeat-with-lease, pod-ready/complete/delete) from the same module version.
  kwokdir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  stages="$(path_of kwok)"; stages="${stages%/*}/stages.yaml"
  mkdir -p "${stages%/*}"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo "---"; cat "$kwokdir/kustomize/stage/$f.yaml"
  done > "$tmp/kwok/stages.yaml"
  mv -f "$tmp/kwok/stages.yaml" "$stages"
  install_bin kwok "$tmp/kwok/kwok"
  echo "  kwok $KWOK_VERSION: $((SECONDS - t))s"
fi

if has prometheus-adapter; then
  # Built through a pinned wrapper module (adapter/go.mod): `go install ...@v0.12.0` trips over
  # the proxy refusing the module's version list when it looks up deprecations.
  t=$SECONDS
  (cd "$here/adapter" && go build "${BUILDFLAGS[@]}" -o "$tmp/adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  install_bin prometheus-adapter "$tmp/adapter"
  echo "  prometheus-adapter $PROMETHEUS_ADAPTER_VERSION: $((SECONDS - t))s"
fi

if has minio; then
  t=$SECONDS
  mkdir -p "$tmp/minio"
  GOBIN="$tmp/minio" go install "${BUILDFLAGS[@]}" "github.com/minio/minio@$MINIO_VERSION"
  install_bin minio "$tmp/minio/minio"
  echo "  minio $MINIO_VERSION: $((SECONDS - t))s"
fi

if has traefik; then
  # Built through a wrapper module (traefik/go.mod) that repeats Traefik's replace and exclude
  # lines and supplies its dynamic-config extension module, which the module zip leaves out.
  t=$SECONDS
  src="$tmp/traefik-src"
  cp -r "$here/traefik" "$src"
  moddir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'; }
  authdir="$(moddir github.com/abbot/go-http-auth@v0.4.0)"
  find "$authdir" -maxdepth 1 -name '*.go' ! -name '*_test.go' -exec cp {} "$src/go-http-auth/" \;
  legover="$(grep -m1 'github.com/go-acme/lego/v5 ' "$(go mod download -json "github.com/traefik/traefik/v3@$TRAEFIK_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')" | awk '{print $2}')"
  cp -r "$(moddir "github.com/go-acme/lego/v5@$legover")" "$src/lego"
  chmod -R u+w "$src/lego"
  for p in $TRAEFIK_UNSERVED_DNS_PROVIDERS; do
    # Its import, and the `case` line before its `return p.NewDNSProvider()`.
    rm -rf "$src/lego/providers/dns/$p"
    awk -v p="$p" '
      $0 ~ "\"github.com/go-acme/lego/v5/providers/dns/" p "\"$" { next }
      $0 ~ "^[[:space:]]*return " p "\\.NewDNSProvider\\(\\)$" { held = ""; next }
      { if (held != "") print held; held = $0; next }
      END { if (held != "") print held }' "$src/lego/providers/dns/zz_gen_dns_providers.go" > "$src/dns.go"
    mv "$src/dns.go" "$src/lego/providers/dns/zz_gen_dns_providers.go"
  done
  mkdir -p "$tmp/traefik"
  (cd "$src" && go build "${BUILDFLAGS[@]}" -o "$tmp/traefik/traefik" github.com/traefik/traefik/v3/cmd/traefik)
  gwdir="$(cd "$src" && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)"
  for f in "$gwdir"/config/crd/standard/gateway.networking.k8s.io_*.yaml; do
    case "$f" in *_vap_*) continue ;; esac
    echo "---"; cat "$f"
  done > "$tmp/traefik/gateway-api-crds.yaml"
  dest="$(path_of traefik)"
  mkdir -p "${dest%/*}"
  mv -f "$tmp/traefik/gateway-api-crds.yaml" "${dest%/*}/gateway-api-crds.yaml"
  install_bin traefik "$tmp/traefik/traefik"
  echo "  traefik $TRAEFIK_VERSION (gateway-api $GATEWAY_API_VERSION CRDs): $((SECONDS - t))s"
fi

keda=()
for b in keda-operator keda-adapter; do has "$b" && keda+=("$b"); done
if [ ${#keda[@]} -gt 0 ]; then
  # One `go build` for both: the operator and the metrics server share nearly every package.
  t=$SECONDS
  mkdir -p "$tmp/keda"
  (cd "$here/keda" && go build "${BUILDFLAGS[@]}" -o "$tmp/keda/" \
    github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter)
  kedadir="$(cd "$here/keda" && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"
  dest="$(path_of keda-operator)"
  mkdir -p "${dest%/*}"
  # Every CRD the operator watches: it exits when one (the eventing group's too) is not installed.
  for f in "$kedadir"/config/crd/bases/*.yaml; do echo "---"; cat "$f"; done > "$tmp/keda/crds.yaml"
  mv -f "$tmp/keda/crds.yaml" "${dest%/*}/keda-crds.yaml"
  for b in "${keda[@]}"; do install_bin "$b" "$tmp/keda/${b#keda-}"; done
  echo "  keda $KEDA_VERSION: $((SECONDS - t))s"
fi

if [ -n "$lws_pid" ]; then wait "$lws_pid"; fi
if [ -n "$tools_pid" ]; then wait "$tools_pid"; fi
echo "build.sh: done in $((SECONDS - start))s"
