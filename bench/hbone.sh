#!/usr/bin/env bash
# HBONE benchmarks for pkg/hbone (see bench/README.md, section "HBONE").
# Prints "bench: <name> <value> <unit>" lines. Takes about 45 seconds.
#   HBONE_SIZE_MIB  MiB per throughput measurement (default 1024)
#   HBONE_ROUNDS    throughput rounds, the median is reported (default 5)
#   HBONE_TUNNELS   idle tunnels for the memory figures (default 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/hbone-bench" ./bench/hbone
"$dir/hbone-bench" throughput -size-mib "${HBONE_SIZE_MIB:-1024}" -rounds "${HBONE_ROUNDS:-5}"
"$dir/hbone-bench" memory -tunnels "${HBONE_TUNNELS:-10000}"
