#!/usr/bin/env bash
# Prints the path of Helm, built once from the Go module proxy at a pinned
# version (helm.sh/helm/v4) and cached (hack/cached-go-install.sh). Build
# output goes to stderr. $CAUSEWAY_HELM, when set, names the binary to use
# instead.
set -euo pipefail
HELM_VERSION=v4.3.2
exec "$(dirname "$0")/../cached-go-install.sh" helm "$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
