#!/usr/bin/env bash
# Runs every benchmark under bench/ (what `make bench` does after `make
# build`). Each prints "bench: <name> <value> <unit>" lines (docs/design.md §9);
# see bench/README.md for what they mean. About 15 minutes on 2 cores.
#   BIN      directory of the built binaries (default bin)
#   GO       go command (default go)
# Extra flags for one program: NODEPROXY_FLAGS, WAYPOINT_FLAGS, LATENCY_FLAGS,
# INGRESS_FLAGS.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
GO=${GO:-go}

for b in controlplane nodeproxy waypoint; do
	if [ ! -x "$BIN/$b" ]; then
		echo "bench: $BIN/$b missing; run make build first" >&2
		exit 1
	fi
done

# The baselines are Debian's: nginx for the waypoint and the ingress Gateway, nginx's stream module
# and stunnel4 for the node proxy pair. The benchmarks run them as their
# own children (the system services are never used); bench/nodeproxy
# skips, saying why, a peer that is still missing.
missing=()
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
	missing+=(nginx)
fi
if [ ! -e /usr/lib/nginx/modules/ngx_stream_module.so ]; then
	missing+=(libnginx-mod-stream)
fi
if ! command -v stunnel4 >/dev/null 2>&1; then
	missing+=(stunnel4)
fi
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "# installing ${missing[*]} (Debian) for the baselines" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
			{ apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; } ||
			echo "bench: could not install ${missing[*]}; the waypoint and ingress benchmarks fail without nginx, the node proxy's skips its missing peers" >&2
	else
		echo "bench: ${missing[*]} not installed (apt-get install -y ${missing[*]}); the waypoint and ingress benchmarks fail without nginx, the node proxy's skips its missing peers" >&2
	fi
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! "$GO" build -o "$dir/" ./bench/nodeproxy ./bench/waypoint ./bench/latency ./bench/ingress; then
	echo "bench: building the benchmark programs failed" >&2
	exit 1
fi

status=0
run() {
	local name=$1
	shift
	echo "# $name" >&2
	local start=$SECONDS
	if ! "$@"; then
		echo "bench: $name FAILED" >&2
		status=1
	fi
	echo "# $name took $((SECONDS - start)) s" >&2
}

if [ -x bench/hbone.sh ]; then
	run hbone ./bench/hbone.sh
fi
# shellcheck disable=SC2086 # the *_FLAGS are word lists on purpose
run nodeproxy "$dir/nodeproxy" -bin "$BIN" ${NODEPROXY_FLAGS:-}
# shellcheck disable=SC2086
run waypoint "$dir/waypoint" -bin "$BIN" ${WAYPOINT_FLAGS:-}
# shellcheck disable=SC2086
run latency "$dir/latency" -bin "$BIN" ${LATENCY_FLAGS:-}
# shellcheck disable=SC2086
run ingress "$dir/ingress" -bin "$BIN" ${INGRESS_FLAGS:-}
exit $status
