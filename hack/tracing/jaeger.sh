#!/usr/bin/env bash
# Prints the path of Jaeger (all-in-one: OTLP receiver on 4317/4318, query
# API on 16686), built once from the Go module proxy at a pinned version and
# cached with the Kubernetes binaries ($CAUSEWAY_CACHE, default
# ~/.cache/causeway), as hack/chart/helm.sh does for Helm. Build output goes
# to stderr. $CAUSEWAY_JAEGER, when set, names the binary to use instead.
set -euo pipefail
if [ -n "${CAUSEWAY_JAEGER:-}" ]; then
  [ -x "$CAUSEWAY_JAEGER" ] || { echo "jaeger: CAUSEWAY_JAEGER=$CAUSEWAY_JAEGER is not executable" >&2; exit 1; }
  echo "$CAUSEWAY_JAEGER"
  exit 0
fi
JAEGER_VERSION=v1.75.0
CACHE=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
DIR=$CACHE/jaeger-$JAEGER_VERSION
BIN=$DIR/jaeger
if [ ! -x "$BIN" ]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.jaeger-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "jaeger: building github.com/jaegertracing/jaeger/cmd/jaeger $JAEGER_VERSION into $DIR (once)" >&2
  start=$(date +%s)
  # A module of its own that requires Jaeger as a tool: Jaeger's go.mod has
  # replace directives, which go install pkg@version refuses.
  (
    cd "$tmp"
    go mod init causeway.local/jaeger-build >&2 2>&1
    GOFLAGS= go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" >&2
    GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags "-s -w" tool >&2
  )
  mkdir -p "$DIR"
  mv "$tmp/jaeger" "$BIN"
  echo "jaeger: built in $(($(date +%s) - start)) s" >&2
fi
echo "$BIN"
