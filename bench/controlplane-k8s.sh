#!/usr/bin/env bash
# The control plane on Kubernetes at scale (bench/README.md, "Control plane
# on Kubernetes"): a real etcd and kube-apiserver (pkg/internal/kubetest)
# with 10,000 pods, 1,000 services and 100 namespaces, the control plane
# binary with --source kubernetes, 100 node proxies subscribed over xDS.
# Needs the Kubernetes binaries (hack/cluster/build.sh, or CAUSEWAY_K8S_BIN).
# About 3 minutes on 2 cores. Prints "bench: <name> <value> <unit>" lines.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
exec "$GO" test -count=1 -run '^$' -bench '^BenchmarkKubernetesScale$' -benchtime 1x -timeout 30m ./pkg/config/kubesource/
