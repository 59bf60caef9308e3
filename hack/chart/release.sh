#!/usr/bin/env bash
# The chart's part of a release: packages charts/causeway as VERSION and
# renders the install for `kubectl apply` with the release's values.
#   hack/chart/release.sh VERSION VALUES OUT
# VERSION  vX.Y.Z (the chart's version is X.Y.Z, its appVersion vX.Y.Z, the
#          images' default tag)
# VALUES   a values file naming the registry and every image's digest:
#            image: {registry: REGISTRY}
#            images:
#              controlplane: {digest: sha256:...}
#              nodeproxy: {digest: sha256:...}
#              agent: {digest: sha256:...}       # causeway-agent
#              cni: {digest: sha256:...}         # causeway-cni
#              waypoint: {digest: sha256:...}
# OUT      the directory that receives causeway-X.Y.Z.tgz (the packaged
#          chart; its default values are the repository's) and install.yaml
#          (Gateway API CRDs, namespace and mesh, every image by digest).
# It refuses a render in which any image is not pinned by digest.
set -euo pipefail
[ $# = 3 ] || { echo "usage: $0 VERSION VALUES OUT" >&2; exit 2; }
VERSION=$1 VALUES=$2 OUT=$3
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "release: VERSION $VERSION is not vX.Y.Z" >&2; exit 2; }
[ -f "$VALUES" ] || { echo "release: no values file $VALUES" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/../.." && pwd)
HELM=$("$REPO/hack/chart/helm.sh")
mkdir -p "$OUT"
"$HELM" lint --strict "$REPO/charts/causeway" --namespace causeway-system --values "$VALUES" >/dev/null
"$HELM" package "$REPO/charts/causeway" --version "${VERSION#v}" --app-version "$VERSION" --destination "$OUT" >/dev/null
chart=$OUT/causeway-${VERSION#v}.tgz
tmp=$OUT/.install.yaml.$$
trap 'rm -f "$tmp"' EXIT
{
  echo "# Causeway $VERSION: kubectl apply --server-side -f install.yaml"
  echo "# Rendered from the chart (causeway-${VERSION#v}.tgz) with the release's values;"
  echo "# the Gateway API CRDs first (clusters that manage them: delete those documents)."
  "$HELM" template causeway "$chart" --namespace causeway-system --include-crds \
    --values "$VALUES" --set namespace.create=true
} >"$tmp"
# Every image (containers, and the waypoints the control plane deploys) by digest.
unpinned=$(grep -E '^\s*(image: |- --waypoint-image=)' "$tmp" | grep -v '@sha256:[0-9a-f]\{64\}$' || true)
if [ -n "$unpinned" ]; then
  echo "release: images not pinned by digest in the render (does $VALUES name every image's digest?):" >&2
  echo "$unpinned" >&2
  exit 1
fi
mv "$tmp" "$OUT/install.yaml"
echo "$chart"
echo "$OUT/install.yaml"
