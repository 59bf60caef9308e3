#!/usr/bin/env bash
# Prints the path of Prometheus, built once from the Go module proxy at a
# pinned version (github.com/prometheus/prometheus/cmd/prometheus) and cached
# (hack/cached-go-install.sh). Build output goes to stderr.
# $CAUSEWAY_PROMETHEUS, when set, names the binary to use instead.
# Only Kubernetes service discovery is built in (Prometheus's
# remove_all_sd/enable_kubernetes_sd tags), and not the web UI's assets (no
# builtinassets tag): the tests use the HTTP API only.
set -euo pipefail
PROMETHEUS_VERSION=v0.316.0
exec "$(dirname "$0")/../cached-go-install.sh" prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus \
  -tags remove_all_sd,enable_kubernetes_sd -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
