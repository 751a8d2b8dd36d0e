#!/usr/bin/env bash
# Sets everything up, then runs lint and the whole test suite (unit, integration on a loopback
# control plane, a real runtime process). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
export TRITON_INTERPRET=${TRITON_INTERPRET:-1}
.venv/bin/python -m pytest "$@"
