#!/usr/bin/env bash
# Make sure a `prometheus` binary is available (for the custom-metrics / HPA integration tests).
# Uses the one on PATH if any; otherwise installs Debian's `prometheus` package when running as
# root on a Debian/Ubuntu system. Prints the path of the binary on success.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
  command -v prometheus
  exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  cat >&2 <<'MSG'
ensure-prometheus.sh: `prometheus` is not on PATH.
  Debian/Ubuntu:  sudo apt-get install -y prometheus   (the service it installs can stay disabled)
  elsewhere:      put a Prometheus 2.x `prometheus` binary on PATH.
MSG
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# the package's maintainer scripts try to start a service; there is none to start here
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
if ! apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y --no-install-recommends prometheus >/dev/null
fi
command -v prometheus
