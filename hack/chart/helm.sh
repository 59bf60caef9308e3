#!/usr/bin/env bash
# Prints the path of Helm, built once from the Go module proxy at a pinned
# version (helm.sh/helm/v4) and cached (hack/cached-tool.sh). $CAUSEWAY_HELM,
# when set, names the binary to use instead.
set -euo pipefail
# shellcheck source=../cached-tool.sh
. "$(dirname "$0")/../cached-tool.sh"
HELM_VERSION=v4.3.2
build_helm() {
  # go install pkg@version: Helm's own go.mod, not this module's.
  GOBIN=$1 CGO_ENABLED=0 GOFLAGS= go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}
cached_tool helm "$HELM_VERSION" CAUSEWAY_HELM build_helm
