#!/usr/bin/env bash
# make conformance: the official Gateway API conformance suite
# (sigs.k8s.io/gateway-api/conformance at the version go.mod pins,
# unmodified) against Causeway installed from manifests/ on the running
# test cluster, or on one brought up for the run and removed afterwards
# (test/conformance). Writes the suite's ConformanceReports to $REPORT
# (the mesh profiles; default bin/conformance/report.yaml) and
# $GATEWAY_REPORT (the gateway profiles; default
# bin/conformance/gateway-report.yaml). Without root there is no cluster:
# it says so and skips.
#
# The suite's workloads run its own images, registry.k8s.io/...; each is
# built here and pushed to the cluster's registry under the suite's name
# and every tag its manifests name, which containerd resolves for
# registry.k8s.io (up.sh), so the suite's manifests run as they are:
# - gateway-api/echo-advanced (the mesh profiles) is Istio's echo
#   application, built from the Go module hack/conformance pins (server as
#   the entrypoint, the client the mesh tests exec, and the certificate its
#   TLS port serves, at the paths of that image);
# - gateway-api/echo-basic (the gateway profiles' backends, HTTP and gRPC)
#   is the suite's own echo-basic, built from the suite's module;
# - coredns/coredns (the gateway base manifests' DNS server, used by no
#   test of the profiles run here, but waited for) is the cluster's CoreDNS
#   build, which has the plugins of the suite's Corefile.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
REPORT=${REPORT:-$REPO/bin/conformance/report.yaml}
GATEWAY_REPORT=${GATEWAY_REPORT:-$REPO/bin/conformance/gateway-report.yaml}

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
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$WORK/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic
ISTIO=$(go list -C hack/conformance -m -f '{{.Dir}}' istio.io/istio)

# push_suite_image IMAGE MANIFEST... -- PUSH-FLAGS...: pushes a built image
# as registry.k8s.io/IMAGE:TAG for every tag the MANIFESTs name.
push_suite_image() {
  local image=$1 manifests=() tags tag; shift
  while [ "$1" != -- ]; do manifests+=("$1"); shift; done
  shift
  tags=$(grep -ho "registry.k8s.io/$image:[^[:space:]\"]*" "${manifests[@]}" | sed 's/.*://' | sort -u)
  [ -n "$tags" ] || die "the suite's manifests name no $image image"
  for tag in $tags; do
    go run ./hack/images push -registry "$REGISTRY_HOST/$(dirname "$image")" -platforms "linux/$(go env GOARCH)" \
      -registry-ca "$CLUSTER_DIR/pki/ca.crt" -tag "$tag" "$@" >/dev/null
    step "image registry.k8s.io/$image:$tag pushed"
  done
}
push_suite_image gateway-api/echo-advanced "$SUITE/mesh/manifests.yaml" -- -binary "$WORK/echo-advanced" \
  -file "/usr/local/bin/client=$WORK/client" \
  -file "/cert.crt=$ISTIO/tests/testdata/certs/dns/cert-chain.pem" \
  -file "/cert.key=$ISTIO/tests/testdata/certs/dns/key.pem"
push_suite_image gateway-api/echo-basic "$SUITE"/base/manifests.yaml "$SUITE"/tests/*.yaml -- -binary "$WORK/echo-basic"
push_suite_image coredns/coredns "$SUITE"/base/manifests.yaml -- -binary "$COREDNS_BIN/coredns"

CAUSEWAY_CONFORMANCE_KUBECONFIG=$KUBECONFIG_ADMIN CAUSEWAY_CONFORMANCE_KUBECTL=$K8S_BIN/kubectl \
  CAUSEWAY_CONFORMANCE_REPORT=$REPORT CAUSEWAY_CONFORMANCE_GATEWAY_REPORT=$GATEWAY_REPORT \
  CAUSEWAY_CONFORMANCE_VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo devel) \
  go test -count=1 -timeout 40m -v ${CONFORMANCE_FLAGS:-} ./test/conformance/...
step "conformance: reports $REPORT, $GATEWAY_REPORT"
