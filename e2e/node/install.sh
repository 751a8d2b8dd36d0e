#!/usr/bin/env bash
# The Debian packages of the real worker node (node.py) and of images/build.sh: containerd, runc,
# the CNI plugins, iptables, buildah and debootstrap. Quick when they are there. Needs root.
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables buildah debootstrap)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "node: installing ${missing[*]}" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
