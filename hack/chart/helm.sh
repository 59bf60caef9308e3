#!/usr/bin/env bash
# Prints the path of Helm, built once from the Go module proxy at a pinned
# version (helm.sh/helm/v4) and cached with the Kubernetes binaries
# ($CAUSEWAY_CACHE, default ~/.cache/causeway), so every worktree and run
# after the first reuses it. Build output goes to stderr. $CAUSEWAY_HELM,
# when set, names the binary to use instead.
set -euo pipefail
if [ -n "${CAUSEWAY_HELM:-}" ]; then
  [ -x "$CAUSEWAY_HELM" ] || { echo "helm: CAUSEWAY_HELM=$CAUSEWAY_HELM is not executable" >&2; exit 1; }
  echo "$CAUSEWAY_HELM"
  exit 0
fi
HELM_VERSION=v4.3.2
CACHE=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
DIR=$CACHE/helm-$HELM_VERSION
BIN=$DIR/helm
if [ ! -x "$BIN" ]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.helm-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "helm: building helm.sh/helm/v4 $HELM_VERSION into $DIR (once)" >&2
  start=$(date +%s)
  # go install pkg@version: Helm's own go.mod, not this module's.
  GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  mkdir -p "$DIR"
  mv "$tmp/helm" "$BIN"
  echo "helm: built in $(($(date +%s) - start)) s" >&2
fi
echo "$BIN"
