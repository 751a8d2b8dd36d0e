#!/usr/bin/env bash
# Sets everything up, then runs lint and the whole test suite (unit, integration on a loopback
# control plane, a real runtime process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# The loopback control plane's binaries, built once per machine and version (minutes when cold),
# outside pytest so that no test's timeout has to cover a Go build.
if command -v go >/dev/null; then
    bash e2e/controlplane/build.sh all
fi
.venv/bin/python -m pytest "$@"
