#!/usr/bin/env bash
# Everything the real worker node (node.py) needs, installed and built ahead of the tests: the
# Debian packages (install.sh); kubelet and kube-proxy from the control plane's Kubernetes pin;
# the sandbox (pause) image.
# Idempotent and quick when everything is there. Needs root on Debian or Ubuntu.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$here/install.sh"

bash "$here/../controlplane/build.sh" node

cache="${PAGODA_NODE_CACHE:-$HOME/.cache/pagoda-node}"
key=$(sha256sum "$here/pause/main.go" | cut -c1-16)
ref="localhost/pagoda-pause:$key"
archive="$cache/pause-$key.oci.tar"
if [ ! -f "$archive" ]; then
    mkdir -p "$cache"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$here/pause" && GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/pause" .)
    container=$(buildah from scratch)
    buildah copy -q "$container" "$tmp/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$container"
    buildah commit --rm -q "$container" "$ref" >/dev/null
    buildah push -q "$ref" "oci-archive:$archive.tmp:$ref" >/dev/null
    mv "$archive.tmp" "$archive"
    echo "node: built $ref" >&2
fi
