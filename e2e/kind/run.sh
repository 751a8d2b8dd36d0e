#!/usr/bin/env bash
# The end-to-end suite (tests/e2e) on a kind cluster: builds both images with docker, creates the
# cluster, runs every scenario, deletes the cluster (PAGODA_KIND_KEEP=1 keeps it). Needs a running
# Docker engine, kind and kubectl on PATH. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
PAGODA_E2E_PROVIDER=kind exec .venv/bin/python -m pytest tests/e2e -m e2e "$@"
