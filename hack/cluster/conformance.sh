#!/usr/bin/env bash
# make conformance: the official Gateway API conformance suite
# (sigs.k8s.io/gateway-api/conformance at the version go.mod pins,
# unmodified) against Causeway installed from manifests/ on the running
# test cluster, or on one brought up for the run and removed afterwards
# (test/conformance). Writes the suite's ConformanceReport to $REPORT
# (default bin/conformance/report.yaml). Without root there is no cluster:
# it says so and skips.
#
# The suite's workloads run its own images, registry.k8s.io/gateway-api/...:
# echo-advanced (the mesh profiles) is Istio's echo application, built here
# from the Go module hack/conformance pins (server as the entrypoint, the
# client the mesh tests exec, and the certificate its TLS port serves, at
# the paths of that image). It is pushed to the cluster's registry under
# the suite's name and tag, which containerd resolves for registry.k8s.io
# (up.sh), so the suite's manifests run as they are.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
REPORT=${REPORT:-$REPO/bin/conformance/report.yaml}

if [ "$(id -u)" != 0 ]; then
  echo "conformance: SKIPPED: the test cluster needs root (bridges, iptables, cgroups, mounts); run as root to include it"
  exit 0
fi
# e2e.sh runs this on its cluster after pushing the images itself.
if [ "${CAUSEWAY_IMAGES_PUSHED:-}" != 1 ]; then
  cluster_for_run conformance
  "$HERE/images.sh" all
fi

cd "$REPO"
SUITE=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
WORK=$REPO/bin/conformance/images
rm -rf "$WORK"
mkdir -p "$WORK"
CGO_ENABLED=0 go build -C hack/conformance -trimpath -ldflags "-s -w" -o "$WORK/" \
  istio.io/istio/pkg/test/echo/cmd/server istio.io/istio/pkg/test/echo/cmd/client
mv "$WORK/server" "$WORK/echo-advanced"
ISTIO=$(go list -C hack/conformance -m -f '{{.Dir}}' istio.io/istio)
# Every tag of the image the suite's mesh manifests name.
tags=$(grep -ho 'registry.k8s.io/gateway-api/echo-advanced:[^[:space:]"]*' "$SUITE/mesh/manifests.yaml" | sed 's/.*://' | sort -u)
[ -n "$tags" ] || die "the suite's mesh manifests name no echo-advanced image"
for tag in $tags; do
  go run ./hack/images push -registry "$REGISTRY_HOST/gateway-api" -platforms "linux/$(go env GOARCH)" \
    -registry-ca "$CLUSTER_DIR/pki/ca.crt" -tag "$tag" -binary "$WORK/echo-advanced" \
    -file "/usr/local/bin/client=$WORK/client" \
    -file "/cert.crt=$ISTIO/tests/testdata/certs/dns/cert-chain.pem" \
    -file "/cert.key=$ISTIO/tests/testdata/certs/dns/key.pem" >/dev/null
  step "image registry.k8s.io/gateway-api/echo-advanced:$tag pushed (Istio's echo)"
done

CAUSEWAY_CONFORMANCE_KUBECONFIG=$KUBECONFIG_ADMIN CAUSEWAY_CONFORMANCE_KUBECTL=$K8S_BIN/kubectl \
  CAUSEWAY_CONFORMANCE_REPORT=$REPORT \
  CAUSEWAY_CONFORMANCE_VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo devel) \
  go test -count=1 -timeout 40m -v ${CONFORMANCE_FLAGS:-} ./test/conformance/...
step "conformance: report $REPORT"
