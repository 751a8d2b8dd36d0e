#!/usr/bin/env bash
# Sets everything up, then runs lint and the whole test suite (unit, integration on a loopback
# control plane, a real runtime process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The end-to-end suite's real node and images need root and Debian's packages; elsewhere it skips.
node=false
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null && command -v go >/dev/null; then
    node=true
    bash e2e/node/install.sh
    # A cold run writes about 25 GiB (the venv, both images, the node's copy); say what there is.
    df -h . | awk 'NR == 2 { print "disk: " $4 " free of " $2 }'
    # Both images (minutes when cold, mostly downloading and unpacking torch) while Go compiles.
    bash images/build.sh >/dev/null &
    images=$!
fi
# The loopback control plane's and the node's binaries, built once per machine and version
# (minutes when cold), outside pytest so that no test's timeout has to cover a Go build.
if command -v go >/dev/null; then
    bash e2e/controlplane/build.sh all
fi
if $node; then
    bash e2e/node/prepare.sh
    wait "$images"
fi
.venv/bin/python -m pytest "$@"
