#!/usr/bin/env bash
# Prints the path of Prometheus, built once from the Go module proxy at a
# pinned version (github.com/prometheus/prometheus/cmd/prometheus) and cached
# with the Kubernetes binaries ($CAUSEWAY_CACHE, default ~/.cache/causeway),
# so every worktree and run after the first reuses it. Build output goes to
# stderr. $CAUSEWAY_PROMETHEUS, when set, names the binary to use instead.
# Only Kubernetes service discovery is built in (Prometheus's
# remove_all_sd/enable_kubernetes_sd tags), and not the web UI's assets (no
# builtinassets tag): the tests use the HTTP API only.
set -euo pipefail
if [ -n "${CAUSEWAY_PROMETHEUS:-}" ]; then
  [ -x "$CAUSEWAY_PROMETHEUS" ] || { echo "prometheus: CAUSEWAY_PROMETHEUS=$CAUSEWAY_PROMETHEUS is not executable" >&2; exit 1; }
  echo "$CAUSEWAY_PROMETHEUS"
  exit 0
fi
PROMETHEUS_VERSION=v0.316.0
CACHE=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
DIR=$CACHE/prometheus-$PROMETHEUS_VERSION
BIN=$DIR/prometheus
if [ ! -x "$BIN" ]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.prometheus-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "prometheus: building github.com/prometheus/prometheus/cmd/prometheus $PROMETHEUS_VERSION into $DIR (once)" >&2
  start=$(date +%s)
  # go install pkg@version: Prometheus's own go.mod, not this module's.
  GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >&2
  mkdir -p "$DIR"
  mv "$tmp/prometheus" "$BIN"
  echo "prometheus: built in $(($(date +%s) - start)) s" >&2
fi
echo "$BIN"
