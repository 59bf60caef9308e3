#!/usr/bin/env bash
# Faults on Kubernetes (bench/README.md, "Faults on Kubernetes"): the rows of
# bench/faults on the running test cluster (make cluster), through
# bench/faultsk8s. Not part of make test; needs root and a running cluster
# (it does not bring one up: the cluster's owner does). It pushes the
# images built from this checkout to the cluster's registry (as make e2e-k8s
# does), installs the mesh
# and the sample, runs the rows and uninstalls both; 6 to 8 minutes.
#
#   bench/faults-k8s.sh [faultsk8s run flags: -row 24s -rate 25 -only REGEXP -keep]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=../hack/cluster/lib.sh
. "$REPO/hack/cluster/lib.sh"
need_root
cluster_running || die "no test cluster answers at $KUBECONFIG_ADMIN: bring it up first (make cluster)"

"$REPO/hack/cluster/images.sh" all
# The load's image: bench/faultsk8s, static (it is the host's driver too).
"$HERE/images-k8s.sh" faultsk8s
STATIC=$REPO/bin/static
(cd "$REPO" && CGO_ENABLED=0 go build -o "$STATIC/" ./bench/faultsk8s)
FAULTS_IMAGE=$(awk '$1 == "faultsk8s" {print $2}' "$REPO/bin/cluster-images/bench.txt")

step "faults-k8s: host load before: $(uptime)"
status=0
"$STATIC/faultsk8s" run -kubeconfig "$KUBECONFIG_ADMIN" -kubectl "$K8S_BIN/kubectl" -ctr-address "$CONTAINERD_SOCK" \
  -image "$FAULTS_IMAGE" -repo "$REPO" "$@" || status=$?
step "faults-k8s: host load after: $(uptime)"
exit $status
