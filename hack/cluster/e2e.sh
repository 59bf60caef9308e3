#!/usr/bin/env bash
# make e2e-k8s: imports the images and runs test/e2e-k8s against the running
# test cluster, or brings one up for the run and removes it afterwards (also
# when something fails). Without root there is no cluster: it says so and
# skips.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "e2e-k8s: SKIPPED: the test cluster needs root (bridges, iptables, cgroups, mounts); run as root to include it"
  exit 0
fi
cluster_for_run e2e-k8s
"$HERE/images.sh" all
# The upgrade test rolls the node proxy to "another" image: the same one
# under a second tag.
UPGRADE_IMAGE=causeway.dev/nodeproxy:e2e-upgrade
ctr_k8s images tag --force causeway.dev/nodeproxy:dev "$UPGRADE_IMAGE" >/dev/null
cd "$HERE/../.."
CAUSEWAY_E2E_KUBECONFIG=$KUBECONFIG_ADMIN CAUSEWAY_E2E_KUBECTL=$K8S_BIN/kubectl \
  CAUSEWAY_E2E_KUBELET_DIR=$CLUSTER_DIR/kubelet CAUSEWAY_E2E_UPGRADE_IMAGE=$UPGRADE_IMAGE \
  go test -count=1 -timeout 15m ${E2E_K8S_FLAGS:-} ./test/e2e-k8s/...
