#!/usr/bin/env bash
# Runs synod's whole test suite on a fresh machine. As root it first installs
# what the tests need (HDL simulators, iproute2) with apt-get when missing.
# CI=true turns every "skip: missing capability" into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v verilator >/dev/null 2>&1 || need+=(verilator)
command -v iverilog  >/dev/null 2>&1 || need+=(iverilog)
command -v yosys     >/dev/null 2>&1 || need+=(yosys)
command -v ip        >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "== not root: cannot install ${need[*]}; the tests that need them will skip (fail under CI=true)"
  fi
fi

echo "== go vet"
go vet ./...
echo "== go test"
# -p 2: the CI machine has 2 cores. Timeouts are generous; the suite is
# expected to take well under 30 minutes.
go test -p 2 -timeout 40m "$@" ./...
