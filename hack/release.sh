#!/usr/bin/env bash
# make release VERSION=vX.Y.Z REGISTRY=...: after `make push` pushed the
# images as REGISTRY/<image>:VERSION and listed them in $REFS
# ("NAME REF@DIGEST" lines), writes dist/:
#   install.yaml  the whole mesh (manifests/), every image pinned by digest
#   images.txt    the pushed images, REF@DIGEST
#   sha256sums    of the two, in sha256sum's format
# and refuses the release (exit 1, dist/ left without install.yaml) when a
# digest install.yaml pins is not what the registry serves as VERSION.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${VERSION:?}" "${REFS:?}"
GO=${GO:-go}
DIST=$REPO/dist

# kubectl for its kustomize: on PATH, else the test cluster's.
kubectl_bin() {
  if command -v kubectl >/dev/null 2>&1; then command -v kubectl; return; fi
  # shellcheck source=cluster/lib.sh
  (. hack/cluster/lib.sh && [ -x "$K8S_BIN/kubectl" ] && echo "$K8S_BIN/kubectl") ||
    { echo "release: kubectl (for kustomize) is not on PATH; hack/cluster/build.sh k8s builds one" >&2; exit 1; }
}

# render_install REFS: the one place the release's install is rendered:
# manifests/ with each image replaced by its pushed digest.
render_install() {
  local refs=$1 overlay
  overlay=$(mktemp -d "$REPO/bin/.release-XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$overlay'" RETURN
  local waypoint
  # Pinned images drop their tag: REPOSITORY@DIGEST is what is pulled.
  waypoint=$(awk '$1 == "waypoint" {sub(/:[^:\/]*@/, "@", $2); print $2}' "$refs")
  [ -n "$waypoint" ] || { echo "release: $refs has no waypoint image" >&2; return 1; }
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [../../manifests]"
    echo "images:"
    local repo
    while read -r name ref; do
      repo=${ref%@*}
      echo "- {name: ghcr.io/causeway-mesh/$name, newName: ${repo%:*}, digest: ${ref#*@}}"
    done <"$refs"
    echo "patches:"
    echo "- target: {kind: Deployment, name: causeway-controlplane}"
    echo "  patch: |"
    echo "    - {op: add, path: /spec/template/spec/containers/0/args/-, value: --waypoint-image=$waypoint}"
  } >"$overlay/kustomization.yaml"
  "$(kubectl_bin)" kustomize "$overlay"
}

mkdir -p "$DIST" "$REPO/bin"
rm -f "$DIST/install.yaml" "$DIST/images.txt" "$DIST/sha256sums"
trap 'rm -f "$DIST/install.yaml.tmp" "$DIST/images.txt.tmp"' EXIT
render_install "$REFS" >"$DIST/install.yaml.tmp"
awk '{print $2}' "$REFS" >"$DIST/images.txt.tmp"
# Every digest pinned must be what the registry serves as VERSION.
ca=()
[ -z "${REGISTRY_CA:-}" ] || ca=(-registry-ca "$REGISTRY_CA")
if ! "$GO" run ./hack/images verify -tag "$VERSION" "${ca[@]}" "$DIST/install.yaml.tmp" "$DIST/images.txt.tmp"; then
  echo "release $VERSION refused: dist/install.yaml would pin images the registry does not serve as $VERSION" >&2
  exit 1
fi
mv "$DIST/install.yaml.tmp" "$DIST/install.yaml"
mv "$DIST/images.txt.tmp" "$DIST/images.txt"
(cd "$DIST" && sha256sum install.yaml images.txt >sha256sums)
echo "release $VERSION: $DIST/install.yaml, images.txt, sha256sums"
