#!/usr/bin/env bash
# Prints the path of Jaeger (all-in-one: OTLP receiver, query API), built
# once from the Go module proxy at a pinned version and cached
# (hack/cached-go-install.sh); test/e2e-k8s receives the waypoint's traces
# with it. $CAUSEWAY_JAEGER, when set, names the binary to use instead. A
# cold build took 996 s on a shared 2-core machine, most of it downloading
# modules.
set -euo pipefail
JAEGER_VERSION=v1.75.0
exec "$(dirname "$0")/../cached-go-install.sh" --module jaeger "$JAEGER_VERSION" github.com/jaegertracing/jaeger/cmd/jaeger -ldflags "-s -w"
