#!/usr/bin/env bash
# make e2e-k8s: pushes the images to the cluster's registry and runs test/e2e-k8s against the running
# test cluster, or brings one up for the run and removes it afterwards (also
# when something fails); a whole run then runs the official Gateway API
# conformance suite on it (conformance.sh). Without root there is no
# cluster: it says so and skips.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "e2e-k8s: SKIPPED: the test cluster needs root (bridges, iptables, cgroups, mounts); run as root to include it"
  exit 0
fi
# Jaeger (built once, cached; traces_test.go) builds while the cluster
# comes up: cold, it takes minutes, mostly fetching modules.
jaeger_path=$(mktemp)
"$HERE/../tracing/jaeger.sh" >"$jaeger_path" &
jaeger_build=$!
cluster_for_run e2e-k8s
"$HERE/images.sh" all
IMAGES=$HERE/../../bin/cluster-images
# The upgrade test rolls the node proxy to another image: the same code as
# another version (so another digest), pushed under a second tag.
(cd "$HERE/../.." && go run ./hack/images push -registry "$REGISTRY_HOST/causeway" -platforms "linux/$(go env GOARCH)" \
  -registry-ca "$CLUSTER_DIR/pki/ca.crt" -tag e2e-upgrade -version e2e-upgrade -refs "$IMAGES/upgrade.txt" ./cmd/nodeproxy) >/dev/null
# REPOSITORY@DIGEST (the tag dropped), as the chart names an image by digest.
UPGRADE_IMAGE=$(awk '{sub(/:[^:\/]*@/, "@", $2); print $2}' "$IMAGES/upgrade.txt")
step "image $UPGRADE_IMAGE pushed (upgrade)"
cd "$HERE/../.."
# The install is `helm install` of charts/causeway (Helm built once, cached)
# with the pushed images by digest (images.sh writes the values).
HELM=$(hack/chart/helm.sh)
# Prometheus (built once, cached) reads the standard metrics back (prometheus_test.go).
PROMETHEUS=$(hack/prometheus/prometheus.sh)
wait "$jaeger_build" || { echo "e2e-k8s: building Jaeger failed" >&2; exit 1; }
CAUSEWAY_E2E_JAEGER=$(cat "$jaeger_path")
rm -f "$jaeger_path"
export CAUSEWAY_E2E_JAEGER
CAUSEWAY_E2E_KUBECONFIG=$KUBECONFIG_ADMIN CAUSEWAY_E2E_KUBECTL=$K8S_BIN/kubectl CAUSEWAY_E2E_HELM=$HELM \
  CAUSEWAY_E2E_IMAGES=$IMAGES/images.txt CAUSEWAY_E2E_VALUES=$IMAGES/values.yaml \
  CAUSEWAY_E2E_KUBELET_DIR=$CLUSTER_DIR/kubelet CAUSEWAY_E2E_NODES_DIR=$NODES_DIR CAUSEWAY_E2E_UPGRADE_IMAGE=$UPGRADE_IMAGE \
  CAUSEWAY_E2E_NODE_SCRIPTS=$HERE CAUSEWAY_E2E_PROMETHEUS=$PROMETHEUS \
  go test -count=1 -timeout 20m ${E2E_K8S_FLAGS:-} ./test/e2e-k8s/...
# A whole run (E2E_K8S_FLAGS without -run) ends with the official Gateway
# API conformance suite on the same cluster (make conformance).
case " ${E2E_K8S_FLAGS:-} " in
  *" -run"*) step "e2e-k8s: a part (-run): the conformance suite left out" ;;
  *) CAUSEWAY_IMAGES_PUSHED=1 "$HERE/conformance.sh" ;;
esac
