#!/usr/bin/env bash
# Latency on Kubernetes (bench/README.md, "Latency on Kubernetes"): what the
# mesh adds to a request on the test cluster, measured by bench/latencyk8s.
# Not part of make test; needs root (the cluster). Uses the running cluster
# (make cluster) or brings one up and removes it afterwards; pushes the
# images built from this checkout (as make e2e-k8s does) and fortio's;
# installs the mesh unless it is installed, measures, removes what it
# installed. About 15 minutes with the defaults (3 rounds of 30 s windows
# at 100 and 1000 requests/s on four paths, then a minute idle).
#
#   bench/latency-k8s.sh [latencyk8s flags: -t 10s -rounds 3 -rates 100,1000 -c 64 -after 0 -uniform -keep]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=../hack/cluster/lib.sh
. "$REPO/hack/cluster/lib.sh"
need_root
cluster_for_run bench-k8s
"$REPO/hack/cluster/images.sh" all
"$HERE/images-k8s.sh" fortio
(cd "$REPO" && go build -o "$REPO/bin/tools/" ./bench/latencyk8s)

step "bench-k8s: host load before: $(uptime)"
status=0
"$REPO/bin/tools/latencyk8s" -kubeconfig "$KUBECONFIG_ADMIN" -kubectl "$K8S_BIN/kubectl" -repo "$REPO" \
  -image "$(awk '$1 == "fortio" {print $2}' "$REPO/bin/cluster-images/bench.txt")" "$@" || status=$?
step "bench-k8s: host load after: $(uptime)"
exit $status
