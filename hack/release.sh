#!/usr/bin/env bash
# make release VERSION=vX.Y.Z REGISTRY=...: after `make push` pushed the
# images as REGISTRY/<image>:VERSION and listed them in $REFS
# ("NAME REF@DIGEST" lines), writes dist/:
#   install.yaml        the chart rendered for kubectl apply, every image
#                       pinned by digest (hack/chart/release.sh)
#   causeway-X.Y.Z.tgz  the packaged chart
#   values.yaml         the values naming those digests (for helm install
#                       of the packaged chart)
#   images.txt          the pushed images, REF@DIGEST
#   sha256sums          of them all, in sha256sum's format
# and refuses the release (exit 1, dist/ left without install.yaml) when a
# digest install.yaml pins is not what the registry serves as VERSION.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${VERSION:?}" "${REFS:?}"
GO=${GO:-go}
DIST=$REPO/dist

mkdir -p "$DIST" "$REPO/bin"
rm -f "$DIST"/install.yaml "$DIST"/images.txt "$DIST"/values.yaml "$DIST"/sha256sums "$DIST"/causeway-*.tgz
stage=$(mktemp -d "$REPO/bin/.release-XXXXXX")
trap 'rm -rf "$stage"' EXIT
"$REPO/hack/chart/values.sh" "$REFS" >"$stage/values.yaml"
"$REPO/hack/chart/release.sh" "$VERSION" "$stage/values.yaml" "$stage" >/dev/null
awk '{print $2}' "$REFS" >"$stage/images.txt"
# Every digest pinned must be what the registry serves as VERSION.
ca=()
[ -z "${REGISTRY_CA:-}" ] || ca=(-registry-ca "$REGISTRY_CA")
if ! "$GO" run ./hack/images verify -tag "$VERSION" "${ca[@]}" "$stage/install.yaml" "$stage/images.txt"; then
  echo "release $VERSION refused: dist/install.yaml would pin images the registry does not serve as $VERSION" >&2
  exit 1
fi
chart=causeway-${VERSION#v}.tgz
mv "$stage/$chart" "$stage/values.yaml" "$stage/images.txt" "$DIST/"
mv "$stage/install.yaml" "$DIST/install.yaml"
(cd "$DIST" && sha256sum install.yaml "$chart" values.yaml images.txt >sha256sums)
echo "release $VERSION: $DIST/install.yaml, $chart, values.yaml, images.txt, sha256sums"
