#!/usr/bin/env bash
# Prints the path of Jaeger (all-in-one: OTLP receiver, query API), built
# once from the Go module proxy at a pinned version and cached
# (hack/cached-tool.sh); test/e2e-k8s receives the waypoint's traces with it.
# $CAUSEWAY_JAEGER, when set, names the binary to use instead. A cold build
# took 996 s on a shared 2-core machine, most of it downloading modules.
set -euo pipefail
# shellcheck source=../cached-tool.sh
. "$(dirname "$0")/../cached-tool.sh"
JAEGER_VERSION=v1.75.0
build_jaeger() {
  # A module of its own that requires Jaeger as a tool: go install
  # pkg@version refuses a module whose go.mod has replace directives.
  (
    cd "$1"
    go mod init causeway.local/jaeger-build
    GOFLAGS= go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION"
    GOBIN=$1 CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags "-s -w" tool
  ) 2>&1
}
cached_tool jaeger "$JAEGER_VERSION" CAUSEWAY_JAEGER build_jaeger
